-- abridge schema, version 13 (PostgreSQL): the pending compaction rows and
-- the pins that hold a value, indexed (see the SQLite form, migrations/0013_bounded_reads.sql).
CREATE INDEX compactions_pending ON compactions (session_id, up_to_turn_index)
    WHERE status = 'pending';
CREATE INDEX pins_slotted_by_value ON pins (session_id, value) WHERE slot IS NOT NULL;
CREATE INDEX pins_held_by_value ON pins (session_id, value)
    WHERE slot IS NULL AND superseded_by IS NULL;
