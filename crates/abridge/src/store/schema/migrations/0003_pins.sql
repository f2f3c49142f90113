-- abridge schema, version 3: pinned facts (G8).
--
-- A pin is a fact a compaction must carry: extracted from a turn in the
-- transaction that finishes it, or pinned by the host. Append-only: a newer
-- value of the same slot is a new row naming the one it supersedes, and the
-- older row is marked superseded once (when, by which pin): the one update a
-- pin ever takes, so that the pins live at a boundary are read through an
-- index, not by walking every value a slot ever had.

CREATE TABLE pins (
    id          INTEGER PRIMARY KEY,
    session_id  INTEGER NOT NULL REFERENCES sessions (id),
    -- The turn that stated it; a host's pin takes the index of the next turn,
    -- so every compaction made after it carries it.
    turn_index  INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    -- The slot it fills ('budget', 'size'); NULL for a fact that stands alone.
    slot        TEXT,
    value       TEXT    NOT NULL CHECK (length(value) > 0),
    sentence    TEXT    NOT NULL,
    source      TEXT    NOT NULL CHECK (source IN ('user', 'assistant', 'tool', 'host')),
    -- A fact mentioned in passing is live only while among the session's
    -- newest ones of its window (the size a compaction records in
    -- pins_window), so a long session keeps a bounded summary: 1 for one
    -- without a slot from a tool result or the assistant's text, 2 for an id,
    -- amount or date the user mentions without naming it. 0: slots, rules,
    -- names, addresses, paths, keys, URLs and the host's pins, which never leave.
    windowed    INTEGER NOT NULL DEFAULT 0 CHECK (windowed IN (0, 1, 2)),
    supersedes  INTEGER REFERENCES pins (id),
    -- Set once, when a newer value of the slot is pinned: its id and turn.
    superseded_by INTEGER REFERENCES pins (id),
    superseded_at INTEGER,
    created_at  INTEGER NOT NULL
);

-- The pins live at a boundary b: never superseded, or superseded after b;
-- the windowed ones newest first.
CREATE INDEX pins_live ON pins (session_id, windowed, superseded_at, turn_index);
CREATE INDEX pins_by_slot ON pins (session_id, slot, id) WHERE slot IS NOT NULL;
-- A fact without a slot is pinned once per session (and not at all when a
-- pin of the session already holds its value).
CREATE UNIQUE INDEX pins_unslotted_once ON pins (session_id, value) WHERE slot IS NULL;
CREATE INDEX pins_by_value ON pins (session_id, value);

CREATE TRIGGER pins_never_deleted BEFORE DELETE ON pins
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (pins are never deleted)'); END;
CREATE TRIGGER pins_never_change BEFORE UPDATE ON pins
WHEN OLD.superseded_by IS NOT NULL OR NEW.superseded_by IS NULL OR NEW.superseded_at IS NULL
  OR NEW.id IS NOT OLD.id OR NEW.session_id IS NOT OLD.session_id
  OR NEW.turn_index IS NOT OLD.turn_index OR NEW.kind IS NOT OLD.kind OR NEW.slot IS NOT OLD.slot
  OR NEW.value IS NOT OLD.value OR NEW.sentence IS NOT OLD.sentence OR NEW.source IS NOT OLD.source
  OR NEW.supersedes IS NOT OLD.supersedes OR NEW.windowed IS NOT OLD.windowed
  OR NEW.created_at IS NOT OLD.created_at
BEGIN SELECT RAISE(ABORT, 'abridge: a pin never changes (it is only marked superseded, once)'); END;

-- What the guard did at completion: the live pins it checked and how many it
-- appended. NULL for a compaction completed before version 3 (G8 is not
-- checked for it).
ALTER TABLE compactions ADD COLUMN pins_live INTEGER;
ALTER TABLE compactions ADD COLUMN pins_added INTEGER;
-- How many of the newest pins mentioned in passing counted as live for it.
ALTER TABLE compactions ADD COLUMN pins_window INTEGER;
