-- abridge schema, version 12: where verification left off.
--
-- `abridge verify --incremental` checks what changed since the newest row
-- here and records a new one when every guarantee holds. A row says: every
-- executed step below `steps_from` and every completed compaction below
-- `compactions_from` held at `at`; those rows never change (a completed
-- summary, an executed step's hash), so a later run checks the rows from
-- these ids on. A redaction or an erasure after the point (`redactions`,
-- `erasures`: the newest ids of their records then) makes the next run a
-- full one. Rows are only added.
CREATE TABLE verified_points (
    id                INTEGER PRIMARY KEY,
    at                INTEGER NOT NULL,
    mode              TEXT    NOT NULL CHECK (mode IN ('full', 'incremental')),
    steps_from        INTEGER NOT NULL,
    compactions_from  INTEGER NOT NULL,
    redactions        INTEGER NOT NULL,
    erasures          INTEGER NOT NULL,
    -- Of the run that recorded it: steps rebuilt and compactions checked.
    steps_checked     INTEGER NOT NULL,
    compactions_checked INTEGER NOT NULL
);
CREATE TRIGGER verified_points_never_change BEFORE UPDATE ON verified_points
BEGIN SELECT RAISE(ABORT, 'abridge: a verified point never changes'); END;
