-- Lyra state, SQLite schema v1.
--
-- Timestamps are Unix milliseconds. JSON columns hold text written by lyra-state (serde_json),
-- never parsed by SQLite itself. Tables are STRICT so a wrongly typed bind fails loudly instead
-- of being stored with SQLite's loose type affinity.

-- One row per deployment (a CLI deployment name or `k8s/<namespace>/<name>`).
CREATE TABLE deployments (
    name       TEXT    NOT NULL PRIMARY KEY,
    -- The workflow last applied; NULL until an apply names one.
    workflow   TEXT,
    created_at INTEGER NOT NULL,
    -- When a run last started (resources carry their own updated_at).
    updated_at INTEGER NOT NULL
) STRICT;

-- The resources a deployment currently manages (or reads). Rows are removed once the resource
-- is deleted; the history in `runs` is kept regardless.
CREATE TABLE resources (
    deployment  TEXT    NOT NULL REFERENCES deployments (name) ON DELETE CASCADE,
    step_id     TEXT    NOT NULL,
    type_name   TEXT    NOT NULL,
    external_id TEXT    NOT NULL,
    desired     TEXT    NOT NULL, -- JSON object
    actual      TEXT    NOT NULL, -- JSON object
    depends_on  TEXT    NOT NULL, -- JSON array of step ids
    managed     INTEGER NOT NULL CHECK (managed IN (0, 1)),
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (deployment, step_id)
) STRICT;

-- The history: one row per run, inserted when it starts and completed when it finishes. A run
-- whose process died keeps finished_at/outcome NULL.
CREATE TABLE runs (
    -- AUTOINCREMENT: ids are never reused, so "newest first" is "highest id first".
    id          INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    deployment  TEXT    NOT NULL REFERENCES deployments (name),
    workflow    TEXT,
    operation   TEXT    NOT NULL CHECK (operation IN ('apply', 'delete')),
    actor       TEXT    NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER,
    outcome     TEXT    CHECK (outcome IN ('succeeded', 'failed', 'cancelled')),
    counts      TEXT    NOT NULL, -- JSON object of change counts
    changes     TEXT    NOT NULL, -- JSON array of {step_id, action, error?}
    error       TEXT
) STRICT;

CREATE INDEX runs_by_deployment ON runs (deployment, id);
