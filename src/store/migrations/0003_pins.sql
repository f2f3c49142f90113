-- abridge schema, version 3: pinned facts (G8).
--
-- A pin is a fact a compaction must carry: extracted from a turn in the
-- transaction that finishes it, or pinned by the host. Append-only: a newer
-- value of the same slot is a new row naming the one it supersedes.

CREATE TABLE pins (
    id          INTEGER PRIMARY KEY,
    session_id  INTEGER NOT NULL REFERENCES sessions (id),
    -- The turn that stated it; a host's pin takes the index of the next turn,
    -- so every compaction made after it carries it.
    turn_index  INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    -- The slot it fills ('budget', 'size'); NULL for a fact that stands alone.
    slot        TEXT,
    value       TEXT    NOT NULL CHECK (length(value) > 0),
    sentence    TEXT    NOT NULL,
    source      TEXT    NOT NULL CHECK (source IN ('user', 'assistant', 'tool', 'host')),
    supersedes  INTEGER REFERENCES pins (id),
    created_at  INTEGER NOT NULL
);

CREATE INDEX pins_by_turn ON pins (session_id, turn_index);
CREATE INDEX pins_by_slot ON pins (session_id, slot, id) WHERE slot IS NOT NULL;
-- A fact without a slot is pinned once per session (and not at all when a
-- pin of the session already holds its value).
CREATE UNIQUE INDEX pins_unslotted_once ON pins (session_id, value) WHERE slot IS NULL;
CREATE INDEX pins_by_value ON pins (session_id, value);

CREATE TRIGGER pins_never_deleted BEFORE DELETE ON pins
BEGIN SELECT RAISE(ABORT, 'abridge: history is append-only (pins are never deleted)'); END;
CREATE TRIGGER pins_never_change BEFORE UPDATE ON pins
BEGIN SELECT RAISE(ABORT, 'abridge: a pin never changes (a newer value supersedes it)'); END;

-- What the guard did at completion: the live pins it checked and how many it
-- appended. NULL for a compaction completed before version 3 (G8 is not
-- checked for it).
ALTER TABLE compactions ADD COLUMN pins_live INTEGER;
ALTER TABLE compactions ADD COLUMN pins_added INTEGER;
