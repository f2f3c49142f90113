-- abridge schema, version 8: the thresholds a compaction was claimed under.
--
-- A compaction row records the threshold in force when it was claimed
-- (`compact_at` in tokens, for the session's model) and, when compaction ran
-- in the background, the soft threshold: what `abridge report` draws as the
-- session's lines without the host's settings being repeated on the command
-- line. NULL on rows claimed before this version, and for a threshold that
-- was off.
ALTER TABLE compactions ADD COLUMN threshold_tokens INTEGER;
ALTER TABLE compactions ADD COLUMN soft_threshold_tokens INTEGER;
