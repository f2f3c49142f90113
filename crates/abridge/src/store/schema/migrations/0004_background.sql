-- abridge schema, version 4: background compaction.
--
-- A compaction claimed at the soft threshold is summarised while the
-- session's steps go on; a step that reaches the hard threshold first waits
-- for it. Both are recorded, so a store says which summaries were made in the
-- background and which steps waited, and for how long.

-- 1: claimed at the soft threshold, summarised in the background; 0: inline
-- (a step waited for it) or manual.
ALTER TABLE compactions ADD COLUMN background INTEGER NOT NULL DEFAULT 0;

-- Milliseconds the step waited for a summary before its model call (a
-- compaction made or finished inline, or a pending one waited for); NULL: it
-- did not wait. Written with the step's response.
ALTER TABLE steps ADD COLUMN summary_wait_ms INTEGER;
