-- abridge schema, version 2: append-only by the schema, not only by promise;
-- the message renderer each executed step was hashed with.
--
-- Applied after version 1 (schema.sql) in the same IMMEDIATE transaction as
-- the version stamp. Every trigger names the rule it enforces in its error.

-- The renderer of the bytes a step hashed (G3): 1 for steps executed before
-- version 2 (JSON floats parsed with serde_json's default, lossy parser),
-- 2 for steps parsed exactly. A rebuild uses the step's own format.
ALTER TABLE steps ADD COLUMN render_format INTEGER NOT NULL DEFAULT 1;

-- History is never deleted (G6).
CREATE TRIGGER sessions_never_deleted BEFORE DELETE ON sessions
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (sessions are never deleted)'); END;
CREATE TRIGGER turns_never_deleted BEFORE DELETE ON turns
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (turns are never deleted)'); END;
CREATE TRIGGER steps_never_deleted BEFORE DELETE ON steps
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (steps are never deleted)'); END;
CREATE TRIGGER tool_invocations_never_deleted BEFORE DELETE ON tool_invocations
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (tool invocations are never deleted)'); END;
CREATE TRIGGER compactions_never_deleted BEFORE DELETE ON compactions
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (compactions are never deleted)'); END;

-- What every step's messages are built from never changes (G3).
CREATE TRIGGER sessions_identity_never_changes
BEFORE UPDATE OF id, external_id, model, system_prompt ON sessions
BEGIN SELECT RAISE(ABORT, 'abridge: a session''s id, model and system prompt never change'); END;

CREATE TRIGGER turns_input_never_changes BEFORE UPDATE OF id, session_id, idx, input ON turns
WHEN NEW.id IS NOT OLD.id OR NEW.session_id IS NOT OLD.session_id OR NEW.idx IS NOT OLD.idx
  OR NEW.input IS NOT OLD.input
BEGIN SELECT RAISE(ABORT, 'abridge: a turn''s position and input never change'); END;

-- Rows in a final status never change; the statuses only move forward.
CREATE TRIGGER turns_finished_never_change BEFORE UPDATE ON turns
WHEN OLD.status IN ('completed', 'failed')
BEGIN SELECT RAISE(ABORT, 'abridge: a finished turn never changes'); END;

CREATE TRIGGER steps_finished_never_change BEFORE UPDATE ON steps
WHEN OLD.status IN ('completed', 'failed')
BEGIN SELECT RAISE(ABORT, 'abridge: a finished step never changes'); END;

CREATE TRIGGER steps_response_never_changes BEFORE UPDATE ON steps
WHEN OLD.status = 'responded' AND (NEW.status NOT IN ('completed', 'failed')
  OR NEW.response IS NOT OLD.response OR NEW.messages_sha256 IS NOT OLD.messages_sha256
  OR NEW.compaction_id IS NOT OLD.compaction_id OR NEW.render_format IS NOT OLD.render_format)
BEGIN SELECT RAISE(ABORT, 'abridge: a step''s recorded response never changes'); END;

CREATE TRIGGER tool_invocations_finished_never_change BEFORE UPDATE ON tool_invocations
WHEN OLD.status IN ('completed', 'failed')
BEGIN SELECT RAISE(ABORT, 'abridge: a finished tool invocation never changes'); END;

-- A completed summary never changes (G2). A failed row may only be re-armed
-- (failed -> pending, Compactor::retry_failed), the one documented transition
-- out of a final status.
CREATE TRIGGER compactions_completed_never_change BEFORE UPDATE ON compactions
WHEN OLD.status = 'completed' OR (OLD.status = 'failed' AND (NEW.status <> 'pending'
  OR NEW.summary IS NOT OLD.summary OR NEW.up_to_turn_index IS NOT OLD.up_to_turn_index))
BEGIN SELECT RAISE(ABORT, 'abridge: a completed compaction never changes; a failed one is only re-armed'); END;
