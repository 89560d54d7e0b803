-- Lyra state, SQLite schema v4: `refresh` runs (`lyra drift --refresh-state`, which records
-- what the providers read as the resources' actual state).

-- SQLite cannot change a CHECK constraint in place: rebuild `runs` with the wider operation
-- list, as 0002 did, keeping every row and the id sequence. Nothing references `runs`, so
-- the foreign keys stay valid.
CREATE TABLE runs_v4 (
    id          INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    deployment  TEXT    NOT NULL REFERENCES deployments (name),
    workflow    TEXT,
    operation   TEXT    NOT NULL CHECK (operation IN ('apply', 'delete', 'unlock', 'forget', 'import', 'refresh')),
    actor       TEXT    NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    outcome     TEXT    CHECK (outcome IN ('succeeded', 'failed', 'cancelled')),
    counts      TEXT    NOT NULL, -- JSON object of change counts
    changes     TEXT    NOT NULL, -- JSON array of {step_id, action, error?}
    error       TEXT,
    -- A human note (e.g. whose lease an unlock broke).
    note        TEXT
) STRICT;

INSERT INTO runs_v4 (id, deployment, workflow, operation, actor, started_at, finished_at, outcome,
                     counts, changes, error, note)
SELECT id, deployment, workflow, operation, actor, started_at, finished_at, outcome, counts, changes,
       error, note
FROM runs;

-- Carry the AUTOINCREMENT high-water mark over, so run ids are still never reused.
DELETE FROM sqlite_sequence WHERE name = 'runs_v4';
INSERT INTO sqlite_sequence (name, seq) SELECT 'runs_v4', seq FROM sqlite_sequence WHERE name = 'runs';

DROP TABLE runs;
ALTER TABLE runs_v4 RENAME TO runs;
CREATE INDEX runs_by_deployment ON runs (deployment, id);
