-- Lyra state, SQLite schema v2: pending resources, run notes, more run operations, leases.

-- A resource whose `create` was asked for but whose result is not recorded yet (the intent).
ALTER TABLE resources ADD COLUMN pending INTEGER NOT NULL DEFAULT 0 CHECK (pending IN (0, 1));

-- The attributes whose values are secret, as a JSON array of names: masked when shown.
ALTER TABLE resources ADD COLUMN sensitive TEXT NOT NULL DEFAULT '[]';

-- SQLite cannot change a CHECK constraint in place: rebuild `runs` with the wider operation
-- list and the new `note` column. Nothing references `runs`, so the foreign keys stay valid.
CREATE TABLE runs_v2 (
    id          INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    deployment  TEXT    NOT NULL REFERENCES deployments (name),
    workflow    TEXT,
    operation   TEXT    NOT NULL CHECK (operation IN ('apply', 'delete', 'unlock', 'forget', 'import')),
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

INSERT INTO runs_v2 (id, deployment, workflow, operation, actor, started_at, finished_at, outcome,
                     counts, changes, error)
SELECT id, deployment, workflow, operation, actor, started_at, finished_at, outcome, counts, changes,
       error
FROM runs;

-- Carry the AUTOINCREMENT high-water mark over, so run ids are still never reused.
DELETE FROM sqlite_sequence WHERE name = 'runs_v2';
INSERT INTO sqlite_sequence (name, seq) SELECT 'runs_v2', seq FROM sqlite_sequence WHERE name = 'runs';

DROP TABLE runs;
ALTER TABLE runs_v2 RENAME TO runs;
CREATE INDEX runs_by_deployment ON runs (deployment, id);

-- One lease per deployment. No foreign key to `deployments`: the first apply of a deployment
-- takes the lease before the deployment exists. Times are Unix ms; a lease whose `expires` is
-- not after now is expired and may be taken over.
CREATE TABLE leases (
    deployment TEXT    NOT NULL PRIMARY KEY,
    owner      TEXT    NOT NULL,
    operation  TEXT    NOT NULL,
    token      TEXT    NOT NULL,
    since      INTEGER NOT NULL,
    expires    INTEGER NOT NULL
) STRICT;
