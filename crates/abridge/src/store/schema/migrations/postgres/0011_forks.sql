-- abridge schema, version 11 (PostgreSQL): sessions that branch, and
-- sessions that run as a parent's tool call (see the SQLite form,
-- migrations/0011_forks.sql).
ALTER TABLE sessions ADD COLUMN parent_id BIGINT REFERENCES sessions (id);
ALTER TABLE sessions ADD COLUMN parent_kind TEXT CHECK (parent_kind IN ('fork', 'delegate'));
ALTER TABLE sessions ADD COLUMN parent_turn BIGINT;
ALTER TABLE sessions ADD COLUMN parent_call TEXT;
ALTER TABLE sessions ADD COLUMN base_compaction_id BIGINT REFERENCES compactions (id);

CREATE INDEX sessions_children ON sessions (parent_id) WHERE parent_id IS NOT NULL;
CREATE UNIQUE INDEX sessions_one_child_per_call ON sessions (parent_id, parent_turn, parent_call)
WHERE parent_kind = 'delegate';

CREATE TABLE session_lineage (
    session_id  BIGINT NOT NULL REFERENCES sessions (id),
    owner_id    BIGINT NOT NULL REFERENCES sessions (id),
    after_idx   BIGINT NOT NULL,
    upto_idx    BIGINT NOT NULL,
    PRIMARY KEY (session_id, owner_id),
    CHECK (after_idx < upto_idx)
);

CREATE FUNCTION abridge_lineage_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM erasing WHERE session_id = OLD.session_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER sessions_parent_never_changes BEFORE UPDATE ON sessions FOR EACH ROW
WHEN (NEW.parent_id IS DISTINCT FROM OLD.parent_id OR NEW.parent_kind IS DISTINCT FROM OLD.parent_kind
      OR NEW.parent_turn IS DISTINCT FROM OLD.parent_turn OR NEW.parent_call IS DISTINCT FROM OLD.parent_call
      OR NEW.base_compaction_id IS DISTINCT FROM OLD.base_compaction_id)
EXECUTE FUNCTION abridge_guard('abridge: where a session comes from never changes', 'always');
CREATE TRIGGER session_lineage_never_changes BEFORE UPDATE ON session_lineage FOR EACH ROW
EXECUTE FUNCTION abridge_lineage_guard('abridge: a fork''s lineage never changes');
CREATE TRIGGER session_lineage_never_deleted BEFORE DELETE ON session_lineage FOR EACH ROW
EXECUTE FUNCTION abridge_lineage_guard('abridge: a fork''s lineage is removed only with the fork');
