-- abridge schema, version 8 (PostgreSQL): the thresholds a compaction was
-- claimed under (see the SQLite form, migrations/0008_thresholds.sql).
ALTER TABLE compactions ADD COLUMN threshold_tokens BIGINT;
ALTER TABLE compactions ADD COLUMN soft_threshold_tokens BIGINT;
