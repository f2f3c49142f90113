-- abridge schema, version 1: the tables.
--
-- A new store gets this and then every numbered migration under
-- src/store/migrations/ (version 2: the append-only triggers and each step's
-- render format), in one IMMEDIATE transaction with the version stamp.
-- History is append-only: rows are inserted, moved forward through their status
-- once, and never updated after they reach a final status (completed / failed).
-- Times are milliseconds since the Unix epoch.

CREATE TABLE sessions (
    id            INTEGER PRIMARY KEY,
    external_id   TEXT    NOT NULL UNIQUE,
    model         TEXT    NOT NULL,
    system_prompt TEXT    NOT NULL,
    config        TEXT    NOT NULL DEFAULT '{}',
    created_at    INTEGER NOT NULL
);

CREATE TABLE turns (
    id               INTEGER PRIMARY KEY,
    session_id       INTEGER NOT NULL REFERENCES sessions (id),
    idx              INTEGER NOT NULL CHECK (idx >= 0),
    input            TEXT    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    output           TEXT,
    error            TEXT,
    -- The lease: who may write this turn's steps, until when, and a fencing epoch
    -- that every takeover increments so a stale holder's writes match no row.
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    UNIQUE (session_id, idx)
);

-- At most one running turn per session.
CREATE UNIQUE INDEX turns_one_running ON turns (session_id) WHERE status = 'running';

CREATE TABLE compactions (
    id                INTEGER PRIMARY KEY,
    session_id        INTEGER NOT NULL REFERENCES sessions (id),
    -- Turns 0..=up_to_turn_index are replaced by the summary.
    up_to_turn_index  INTEGER NOT NULL CHECK (up_to_turn_index >= 0),
    up_to_turn_id     INTEGER NOT NULL REFERENCES turns (id),
    -- The completed compaction this one folded in (NULL for the first).
    previous_id       INTEGER REFERENCES compactions (id),
    status            TEXT    NOT NULL CHECK (status IN ('pending', 'completed', 'failed')),
    summary           TEXT,
    -- SHA-256 of the summary at completion: a later change is detectable (G2).
    summary_sha256    TEXT,
    trigger           TEXT    NOT NULL CHECK (trigger IN ('auto', 'manual')),
    focus             TEXT,
    attempts          INTEGER NOT NULL DEFAULT 0,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    model             TEXT,
    prompt_sha256     TEXT,
    -- The context measure that triggered it (reported or estimated input tokens).
    trigger_tokens    INTEGER,
    tokens_before     INTEGER,
    tokens_after      INTEGER,
    input_tokens      INTEGER,
    output_tokens     INTEGER,
    summary_calls     INTEGER NOT NULL DEFAULT 0,
    error             TEXT,
    created_at        INTEGER NOT NULL,
    completed_at      INTEGER,
    CHECK (status <> 'completed' OR (summary IS NOT NULL AND length(summary) > 0))
);

-- G1: the index is the lock. One row per (session, boundary), ever.
CREATE UNIQUE INDEX compactions_one_per_boundary ON compactions (session_id, up_to_turn_index);

CREATE TABLE steps (
    id              INTEGER PRIMARY KEY,
    turn_id         INTEGER NOT NULL REFERENCES turns (id),
    idx             INTEGER NOT NULL CHECK (idx >= 0),
    status          TEXT    NOT NULL CHECK (status IN ('running', 'responded', 'completed', 'failed')),
    -- What the step read: the completed compaction (NULL: none) and the hash of
    -- the exact message bytes it sent.
    compaction_id   INTEGER REFERENCES compactions (id),
    messages_sha256 TEXT,
    response        TEXT,
    input_tokens    INTEGER,
    output_tokens   INTEGER,
    -- The context measure compaction decides on: the reported input tokens, or a
    -- deterministic estimate of the built messages when none was reported.
    context_tokens  INTEGER,
    estimated       INTEGER NOT NULL DEFAULT 0,
    error           TEXT,
    created_at      INTEGER NOT NULL,
    responded_at    INTEGER,
    completed_at    INTEGER,
    UNIQUE (turn_id, idx)
);

CREATE TABLE tool_invocations (
    id              INTEGER PRIMARY KEY,
    step_id         INTEGER NOT NULL REFERENCES steps (id),
    -- Position of the call in the step's response; results render in this order.
    position        INTEGER NOT NULL,
    tool_call_id    TEXT    NOT NULL,
    tool_name       TEXT    NOT NULL,
    arguments       TEXT    NOT NULL,
    effect          TEXT    NOT NULL CHECK (effect IN ('transactional', 'idempotent', 'at_most_once', 'none')),
    idempotency_key TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('started', 'completed', 'failed')),
    result          TEXT,
    attempts        INTEGER NOT NULL DEFAULT 1,
    created_at      INTEGER NOT NULL,
    completed_at    INTEGER,
    UNIQUE (step_id, tool_call_id)
);
