-- abridge schema, version 5: real model providers.
--
-- A provider's prompt cache: the input tokens of a step read from it and
-- written to it, as the provider reported them (NULL: not reported).
ALTER TABLE steps ADD COLUMN cache_read_tokens INTEGER;
ALTER TABLE steps ADD COLUMN cache_write_tokens INTEGER;

-- Context overflow inside one turn: the tool results of the turn's first
-- `elided_steps` steps were sent as a short placeholder naming the call (the
-- full results stay in `tool_invocations`). Part of what the step's bytes
-- were rendered from, so a rebuild applies it; 0 for every other step.
ALTER TABLE steps ADD COLUMN elided_steps INTEGER NOT NULL DEFAULT 0;

-- Written with the response and never changed after, as the rest of it.
DROP TRIGGER steps_response_never_changes;
CREATE TRIGGER steps_response_never_changes BEFORE UPDATE ON steps
WHEN OLD.status = 'responded' AND (NEW.status NOT IN ('completed', 'failed')
  OR NEW.response IS NOT OLD.response OR NEW.messages_sha256 IS NOT OLD.messages_sha256
  OR NEW.compaction_id IS NOT OLD.compaction_id OR NEW.render_format IS NOT OLD.render_format
  OR NEW.elided_steps IS NOT OLD.elided_steps)
BEGIN SELECT RAISE(ABORT, 'abridge: a step''s recorded response never changes'); END;
