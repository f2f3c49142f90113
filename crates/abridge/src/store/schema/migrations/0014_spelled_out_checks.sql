-- abridge schema, version 14: the columns' checks of a list of values
-- spelled out, the same rules; the index of the values pins hold, in the
-- order they are asked for.
--
-- SQLite runs a column's `CHECK (x IN ('a', 'b', 'c'))` of three or more
-- values by building a temporary b-tree of the list (a page cache made,
-- filled and freed) at every row it writes: every turn, step and tool
-- invocation paid for one or more of them. `x = 'a' OR x = 'b' OR x = 'c'`
-- is the same rule (a NULL passes both, NOT NULL refuses it) and compares in
-- place. No row changes, so the tables are not rebuilt: the migration's hook
-- (`spell_out_checks`) rewrites the checks' text in the schema, in this
-- transaction, as SQLite documents for a change of a table's constraints
-- that leaves its rows as they are, and re-reads the schema before the
-- version stamp.

-- Who holds a value asks for the newest of its pins not superseded (by turn,
-- then id): through `pins_held_by_value` (session_id, value) alone SQLite
-- sorted them in a temporary b-tree at every run. With the turn in the
-- index (and the id, SQLite's rowid, after it) the newest is its last entry.
DROP INDEX pins_held_by_value;
CREATE INDEX pins_held_by_value ON pins (session_id, value, turn_index)
    WHERE slot IS NULL AND superseded_by IS NULL;
