-- abridge schema, version 11: sessions that branch, and sessions that run
-- as a parent's tool call.
--
-- A fork's history is its parent's turns up to and including its fork point,
-- read where they are, never copied: `session_lineage` names, for a fork,
-- every ancestor whose turns it reads and which of them (after_idx <
-- idx <= upto_idx), one row per ancestor, written once when the fork is made.
-- Its own turns start after the fork point. It reads the compaction its
-- parent had completed at or before the fork point (`base_compaction_id`)
-- until it completes its own.
--
-- A delegated child (parent_kind 'delegate') runs as the effect of one tool
-- call of its parent (parent_turn: the turn's index, parent_call: the call's
-- id): one child per call, ever (the unique index). It reads nothing of its
-- parent's history.
ALTER TABLE sessions ADD COLUMN parent_id INTEGER REFERENCES sessions (id);
ALTER TABLE sessions ADD COLUMN parent_kind TEXT CHECK (parent_kind IN ('fork', 'delegate'));
ALTER TABLE sessions ADD COLUMN parent_turn INTEGER;
ALTER TABLE sessions ADD COLUMN parent_call TEXT;
ALTER TABLE sessions ADD COLUMN base_compaction_id INTEGER REFERENCES compactions (id);

CREATE INDEX sessions_children ON sessions (parent_id) WHERE parent_id IS NOT NULL;
CREATE UNIQUE INDEX sessions_one_child_per_call ON sessions (parent_id, parent_turn, parent_call)
WHERE parent_kind = 'delegate';

CREATE TABLE session_lineage (
    session_id  INTEGER NOT NULL REFERENCES sessions (id),
    owner_id    INTEGER NOT NULL REFERENCES sessions (id),
    after_idx   INTEGER NOT NULL,
    upto_idx    INTEGER NOT NULL,
    PRIMARY KEY (session_id, owner_id),
    CHECK (after_idx < upto_idx)
);

-- Where a session comes from never changes; its lineage goes only with it.
CREATE TRIGGER sessions_parent_never_changes
BEFORE UPDATE OF parent_id, parent_kind, parent_turn, parent_call, base_compaction_id ON sessions
WHEN NEW.parent_id IS NOT OLD.parent_id OR NEW.parent_kind IS NOT OLD.parent_kind
  OR NEW.parent_turn IS NOT OLD.parent_turn OR NEW.parent_call IS NOT OLD.parent_call
  OR NEW.base_compaction_id IS NOT OLD.base_compaction_id
BEGIN SELECT RAISE(ABORT, 'abridge: where a session comes from never changes'); END;
CREATE TRIGGER session_lineage_never_changes BEFORE UPDATE ON session_lineage
BEGIN SELECT RAISE(ABORT, 'abridge: a fork''s lineage never changes'); END;
CREATE TRIGGER session_lineage_never_deleted BEFORE DELETE ON session_lineage
WHEN NOT EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id)
BEGIN SELECT RAISE(ABORT, 'abridge: a fork''s lineage is removed only with the fork'); END;
