-- abridge schema, version 7: redaction.
--
-- The second and last exception to append-only history (after deleting a
-- session, version 6): a leaked secret can be replaced, wherever a session
-- stores it, by the fixed marker `[redacted]` (Store::redact, `abridge
-- redact`). The redacting transaction opens the same `erasing` gate as a
-- delete, for its one session, and closes it before it commits: no other
-- connection ever sees it open, so for everyone else every trigger holds.
--
-- A redaction is recorded (when, the SHA-256 of the pattern, which rows), and
-- with it the hash each changed row now verifies against: `verify` reports
-- a step whose messages now rebuild with the marker as redacted (its recorded
-- hash is of the bytes before), not as a G3 violation, and a changed summary
-- as redacted, not as a G2 violation.
CREATE TABLE redactions (
    id              INTEGER PRIMARY KEY,
    session_id      INTEGER NOT NULL REFERENCES sessions (id),
    pattern_kind    TEXT    NOT NULL CHECK (pattern_kind IN ('text', 'regex')),
    pattern_sha256  TEXT    NOT NULL,
    marker          TEXT    NOT NULL,
    -- Occurrences replaced, and rows changed by table (JSON).
    occurrences     INTEGER NOT NULL,
    rows            TEXT    NOT NULL,
    -- Executed steps whose messages now rebuild to other bytes.
    steps_rebuilt   INTEGER NOT NULL,
    -- Running turns fenced (their lease epoch moved on: a runner still
    -- holding one is refused at its next write; the turn resumes from the
    -- redacted rows).
    turns_fenced    INTEGER NOT NULL,
    at              INTEGER NOT NULL
);
CREATE INDEX redactions_by_session ON redactions (session_id, id);

-- The rows a redaction changed, by table, and what each is checked against
-- since: for `step_messages` (an executed step whose rebuilt messages
-- changed) the SHA-256 of its messages rebuilt after the redaction; for
-- `compactions` the SHA-256 of the summary after; for `turns` the SHA-256 of
-- the input before (a host re-submitting a turn with its original input is
-- recognised, not refused as a conflict); NULL for the others.
CREATE TABLE redacted_rows (
    redaction_id INTEGER NOT NULL REFERENCES redactions (id),
    tbl          TEXT    NOT NULL CHECK (tbl IN ('sessions', 'turns', 'steps', 'tool_invocations',
                                                 'compactions', 'pins', 'step_messages')),
    row_id       INTEGER NOT NULL,
    sha256       TEXT,
    PRIMARY KEY (tbl, row_id, redaction_id)
) WITHOUT ROWID;
CREATE INDEX redacted_rows_by_redaction ON redacted_rows (redaction_id);

CREATE TRIGGER redactions_never_change BEFORE UPDATE ON redactions
BEGIN SELECT RAISE(ABORT, 'abridge: a redaction record never changes'); END;
CREATE TRIGGER redactions_never_deleted BEFORE DELETE ON redactions
WHEN NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a redaction record is removed only with its session'); END;
CREATE TRIGGER redacted_rows_never_change BEFORE UPDATE ON redacted_rows
BEGIN SELECT RAISE(ABORT, 'abridge: a redaction record never changes'); END;
CREATE TRIGGER redacted_rows_never_deleted BEFORE DELETE ON redacted_rows
WHEN NOT EXISTS (SELECT 1 FROM erasing e JOIN redactions r ON r.session_id = e.session_id
                 WHERE r.id = OLD.redaction_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a redaction record is removed only with its session'); END;

-- The update triggers of version 2-5, each now held unless its session is
-- in `erasing` (the redacting transaction). What they hold is unchanged.
DROP TRIGGER sessions_identity_never_changes;
CREATE TRIGGER sessions_identity_never_changes
BEFORE UPDATE OF id, external_id, model, system_prompt ON sessions
WHEN NEW.id IS NOT OLD.id OR NEW.external_id IS NOT OLD.external_id
  OR NEW.model IS NOT OLD.model
  OR (NEW.system_prompt IS NOT OLD.system_prompt
      AND NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.id))
BEGIN SELECT RAISE(ABORT, 'abridge: a session''s id, model and system prompt never change'); END;

DROP TRIGGER turns_input_never_changes;
CREATE TRIGGER turns_input_never_changes BEFORE UPDATE OF id, session_id, idx, input ON turns
WHEN NEW.id IS NOT OLD.id OR NEW.session_id IS NOT OLD.session_id OR NEW.idx IS NOT OLD.idx
  OR (NEW.input IS NOT OLD.input
      AND NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id))
BEGIN SELECT RAISE(ABORT, 'abridge: a turn''s position and input never change'); END;

DROP TRIGGER turns_finished_never_change;
CREATE TRIGGER turns_finished_never_change BEFORE UPDATE ON turns
WHEN OLD.status IN ('completed', 'failed')
  AND NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a finished turn never changes'); END;

DROP TRIGGER steps_finished_never_change;
CREATE TRIGGER steps_finished_never_change BEFORE UPDATE ON steps
WHEN OLD.status IN ('completed', 'failed')
  AND NOT EXISTS (SELECT 1 FROM erasing e JOIN turns t ON t.session_id = e.session_id
                  WHERE t.id = OLD.turn_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a finished step never changes'); END;

DROP TRIGGER steps_response_never_changes;
CREATE TRIGGER steps_response_never_changes BEFORE UPDATE ON steps
WHEN OLD.status = 'responded' AND (NEW.status NOT IN ('completed', 'failed')
  OR NEW.response IS NOT OLD.response OR NEW.messages_sha256 IS NOT OLD.messages_sha256
  OR NEW.compaction_id IS NOT OLD.compaction_id OR NEW.render_format IS NOT OLD.render_format
  OR NEW.elided_steps IS NOT OLD.elided_steps)
  AND NOT EXISTS (SELECT 1 FROM erasing e JOIN turns t ON t.session_id = e.session_id
                  WHERE t.id = OLD.turn_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a step''s recorded response never changes'); END;

DROP TRIGGER tool_invocations_finished_never_change;
CREATE TRIGGER tool_invocations_finished_never_change BEFORE UPDATE ON tool_invocations
WHEN OLD.status IN ('completed', 'failed')
  AND NOT EXISTS (SELECT 1 FROM erasing e JOIN turns t ON t.session_id = e.session_id
                  JOIN steps s ON s.turn_id = t.id WHERE s.id = OLD.step_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a finished tool invocation never changes'); END;

DROP TRIGGER compactions_completed_never_change;
CREATE TRIGGER compactions_completed_never_change BEFORE UPDATE ON compactions
WHEN (OLD.status = 'completed' OR (OLD.status = 'failed' AND (NEW.status <> 'pending'
  OR NEW.summary IS NOT OLD.summary OR NEW.up_to_turn_index IS NOT OLD.up_to_turn_index)))
  AND NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a completed compaction never changes; a failed one is only re-armed'); END;

DROP TRIGGER pins_never_change;
CREATE TRIGGER pins_never_change BEFORE UPDATE ON pins
WHEN (OLD.superseded_by IS NOT NULL OR NEW.superseded_by IS NULL OR NEW.superseded_at IS NULL
  OR NEW.id IS NOT OLD.id OR NEW.session_id IS NOT OLD.session_id
  OR NEW.turn_index IS NOT OLD.turn_index OR NEW.kind IS NOT OLD.kind OR NEW.slot IS NOT OLD.slot
  OR NEW.value IS NOT OLD.value OR NEW.sentence IS NOT OLD.sentence OR NEW.source IS NOT OLD.source
  OR NEW.supersedes IS NOT OLD.supersedes OR NEW.windowed IS NOT OLD.windowed
  OR NEW.created_at IS NOT OLD.created_at)
  AND NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a pin never changes (it is only marked superseded, once)'); END;

-- Two facts pinned once each may read the same once redacted ("key sk-1" and
-- "key sk-2" both become "key [redacted]"): a redacted value is not held to
-- being pinned once.
DROP INDEX pins_unslotted_once;
CREATE UNIQUE INDEX pins_unslotted_once ON pins (session_id, value)
WHERE slot IS NULL AND instr(value, '[redacted]') = 0;
