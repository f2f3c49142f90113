-- abridge schema, version 6: deleting a session, and what records it.
--
-- History is append-only, with one documented exception: a session can be
-- deleted whole (Store::delete_session, `abridge delete`, `abridge prune`).
-- The append-only triggers hold unless a row is in `erasing`, which only
-- the deleting transaction inserts and removes again before it commits: no
-- other connection ever sees it, so for everyone else the triggers hold.
CREATE TABLE erasing (session_id INTEGER NOT NULL);

-- What was deleted, when: the session's row id (so a runner still working
-- on it is told it was deleted, not that it never existed), the SHA-256 of
-- its external id (not the id: it may name a person), and the rows removed.
CREATE TABLE erasures (
    id                  INTEGER PRIMARY KEY,
    kind                TEXT    NOT NULL CHECK (kind IN ('delete')),
    session_id          INTEGER NOT NULL,
    external_id_sha256  TEXT    NOT NULL,
    rows                TEXT    NOT NULL,
    at                  INTEGER NOT NULL,
    -- The highest ids of these tables when the session was deleted: a new
    -- row never takes a deleted row's id (SQLite would reuse the highest),
    -- so a runner still holding a deleted turn or compaction can never
    -- match a new one.
    sessions_id_floor    INTEGER NOT NULL,
    turns_id_floor       INTEGER NOT NULL,
    compactions_id_floor INTEGER NOT NULL
);
CREATE INDEX erasures_by_session ON erasures (session_id);

DROP TRIGGER sessions_never_deleted;
DROP TRIGGER turns_never_deleted;
DROP TRIGGER steps_never_deleted;
DROP TRIGGER tool_invocations_never_deleted;
DROP TRIGGER compactions_never_deleted;
DROP TRIGGER pins_never_deleted;

CREATE TRIGGER sessions_never_deleted BEFORE DELETE ON sessions
WHEN NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.id)
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (sessions are never deleted, but by delete_session)'); END;
CREATE TRIGGER turns_never_deleted BEFORE DELETE ON turns
WHEN NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (turns are never deleted)'); END;
CREATE TRIGGER steps_never_deleted BEFORE DELETE ON steps
WHEN NOT EXISTS (SELECT 1 FROM erasing e JOIN turns t ON t.session_id = e.session_id
                 WHERE t.id = OLD.turn_id)
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (steps are never deleted)'); END;
CREATE TRIGGER tool_invocations_never_deleted BEFORE DELETE ON tool_invocations
WHEN NOT EXISTS (SELECT 1 FROM erasing e JOIN turns t ON t.session_id = e.session_id
                 JOIN steps s ON s.turn_id = t.id WHERE s.id = OLD.step_id)
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (tool invocations are never deleted)'); END;
CREATE TRIGGER compactions_never_deleted BEFORE DELETE ON compactions
WHEN NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (compactions are never deleted)'); END;
CREATE TRIGGER pins_never_deleted BEFORE DELETE ON pins
WHEN NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (pins are never deleted)'); END;

-- An erasure record is itself never changed or removed.
CREATE TRIGGER erasures_never_change BEFORE UPDATE ON erasures
BEGIN SELECT RAISE(ABORT, 'abridge: an erasure record never changes'); END;
CREATE TRIGGER erasures_never_deleted BEFORE DELETE ON erasures
BEGIN SELECT RAISE(ABORT, 'abridge: an erasure record is never deleted'); END;
