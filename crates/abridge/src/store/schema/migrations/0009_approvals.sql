-- abridge schema, version 9: tool calls that wait for a human's decision or
-- for a result another process delivers.
--
-- A call that needs a decision (or a deferred tool's call) gets one row here,
-- in the step's transaction, instead of running; its turn stays `running`
-- with its lease released (parked: a row, not a future). A decision moves the
-- row from `pending` once (`UPDATE ... WHERE status = 'pending'`: the first
-- decision wins) and is never changed after. An approved call then runs
-- under its effect mode with its own `tool_invocations` row, as any call.
CREATE TABLE approvals (
    -- AUTOINCREMENT: a call id a human was shown is never reused after a delete.
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id    INTEGER NOT NULL REFERENCES sessions (id),
    turn_id       INTEGER NOT NULL REFERENCES turns (id),
    step_id       INTEGER NOT NULL REFERENCES steps (id),
    position      INTEGER NOT NULL,
    tool_call_id  TEXT    NOT NULL,
    tool_name     TEXT    NOT NULL,
    -- The arguments as the model wrote them.
    arguments     TEXT    NOT NULL,
    effect        TEXT    NOT NULL CHECK (effect IN ('transactional', 'idempotent', 'at_most_once', 'deferred')),
    -- 'approval': waits for a decision; 'result': for a delivered result.
    kind          TEXT    NOT NULL CHECK (kind IN ('approval', 'result')),
    status        TEXT    NOT NULL CHECK (status IN ('pending', 'approved', 'rejected', 'delivered', 'abandoned')),
    -- Approved with edited arguments: those the tool is called with.
    input         TEXT,
    -- A rejection's message, or a delivered result: what the model sees.
    note          TEXT,
    -- A delivered result: 1 ok, 0 an error result.
    ok            INTEGER,
    -- Approved with "always allow this tool in this session".
    always        INTEGER NOT NULL DEFAULT 0,
    decided_by    TEXT,
    created_at    INTEGER NOT NULL,
    decided_at    INTEGER,
    UNIQUE (step_id, tool_call_id)
);
CREATE INDEX approvals_by_session ON approvals (session_id, status);

-- "Always allow this tool in this session": recorded by the decision that
-- said so.
CREATE TABLE approval_grants (
    session_id    INTEGER NOT NULL REFERENCES sessions (id),
    tool_name     TEXT    NOT NULL,
    approval_id   INTEGER NOT NULL REFERENCES approvals (id),
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (session_id, tool_name)
);

-- A decision is taken once; it and a grant go only with their session.
CREATE TRIGGER approvals_decided_never_change BEFORE UPDATE ON approvals
WHEN (OLD.status <> 'pending' OR NEW.id IS NOT OLD.id OR NEW.session_id IS NOT OLD.session_id
  OR NEW.step_id IS NOT OLD.step_id OR NEW.tool_call_id IS NOT OLD.tool_call_id
  OR NEW.kind IS NOT OLD.kind OR NEW.effect IS NOT OLD.effect
  OR NEW.arguments IS NOT OLD.arguments)
  AND NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a decision is taken once and never changes'); END;
CREATE TRIGGER approvals_never_deleted BEFORE DELETE ON approvals
WHEN NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a decision is removed only with its session'); END;
CREATE TRIGGER approval_grants_never_change BEFORE UPDATE ON approval_grants
BEGIN SELECT RAISE(ABORT, 'abridge: a grant never changes'); END;
CREATE TRIGGER approval_grants_never_deleted BEFORE DELETE ON approval_grants
WHEN NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a grant is removed only with its session'); END;
