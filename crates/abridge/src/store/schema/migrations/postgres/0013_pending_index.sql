-- abridge schema, version 13 (PostgreSQL): the pending compaction rows,
-- indexed (see the SQLite form, migrations/0013_pending_index.sql).
CREATE INDEX compactions_pending ON compactions (session_id, up_to_turn_index)
    WHERE status = 'pending';
