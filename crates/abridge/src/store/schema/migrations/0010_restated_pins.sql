-- abridge schema, version 10: a fact mentioned again refreshes its turn.
--
-- A value without a slot that is mentioned in passing (a tool's id, an
-- amount or a date the user mentions without naming it) is live only while
-- among the newest of its window. Mentioned again in a later turn, it gets a
-- new pin at that turn naming the earlier one, which is marked superseded
-- then (the one update a pin takes), so a fact still in play stays in the
-- window; a user repeating a tool's value makes it the user's fact. A value
-- is still pinned at most once a turn, and (kept by the writer, under the
-- session's write lock) has one pin not superseded.
DROP INDEX pins_unslotted_once;
CREATE UNIQUE INDEX pins_unslotted_once_a_turn ON pins (session_id, value, turn_index)
WHERE slot IS NULL AND instr(value, '[redacted]') = 0;
