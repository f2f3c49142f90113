-- abridge schema, version 14 (PostgreSQL): the index of the values pins
-- hold, in the order they are asked for (see the SQLite form,
-- migrations/0014_spelled_out_checks.sql, which also rewrites checks that
-- SQLite runs by building a temporary b-tree; PostgreSQL compares a list in
-- place).
DROP INDEX pins_held_by_value;
CREATE INDEX pins_held_by_value ON pins (session_id, value, turn_index, id)
    WHERE slot IS NULL AND superseded_by IS NULL;
