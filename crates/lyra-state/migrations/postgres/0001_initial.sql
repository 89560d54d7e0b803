-- Lyra state, Postgres schema v1: the same logical schema as SQLite's 0001 + 0002.
--
-- Timestamps are Unix milliseconds (BIGINT), as on SQLite, so rows convert one to one.
--
-- JSON columns are TEXT, not jsonb/json: jsonb reorders object keys and normalises numbers
-- (u64::MAX, 1e300 come back different), and the engine compares states exactly and keeps the
-- author's key order. TEXT gives back the bytes lyra-state wrote, identical to the SQLite
-- store, and nothing here queries inside the payloads.
--
-- Tables are unqualified: the store sets `search_path` to its schema (URL `schema=`).
--
-- Names and step ids are COLLATE "C": `list` and `load` sort them by byte, as SQLite does,
-- whatever the database's locale.

CREATE TABLE deployments (
    name       TEXT   COLLATE "C" NOT NULL PRIMARY KEY,
    -- The workflow last applied; NULL until an apply names one.
    workflow   TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE resources (
    deployment  TEXT    COLLATE "C" NOT NULL REFERENCES deployments (name) ON DELETE CASCADE,
    step_id     TEXT    COLLATE "C" NOT NULL,
    type_name   TEXT    NOT NULL,
    external_id TEXT    NOT NULL,
    desired     TEXT    NOT NULL, -- JSON object
    actual      TEXT    NOT NULL, -- JSON object
    depends_on  TEXT    NOT NULL, -- JSON array of step ids
    managed     BOOLEAN NOT NULL,
    -- `create` was asked for, its result is not recorded yet.
    pending     BOOLEAN NOT NULL DEFAULT FALSE,
    -- The attributes whose values are secret, as a JSON array of names: masked when shown.
    sensitive   TEXT    NOT NULL DEFAULT '[]',
    updated_at  BIGINT  NOT NULL,
    PRIMARY KEY (deployment, step_id)
);

CREATE TABLE runs (
    -- Identity ids only grow, so "newest first" is "highest id first" (gaps are fine).
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    deployment  TEXT   COLLATE "C" NOT NULL REFERENCES deployments (name),
    workflow    TEXT,
    operation   TEXT   NOT NULL CHECK (operation IN ('apply', 'delete', 'unlock', 'forget', 'import')),
    actor       TEXT   NOT NULL,
    started_at  BIGINT NOT NULL,
    finished_at BIGINT,
    outcome     TEXT   CHECK (outcome IN ('succeeded', 'failed', 'cancelled')),
    counts      TEXT   NOT NULL, -- JSON object of change counts
    changes     TEXT   NOT NULL, -- JSON array of {step_id, action, error?}
    error       TEXT,
    note        TEXT
);

CREATE INDEX runs_by_deployment ON runs (deployment, id);

-- One lease per deployment; no foreign key, since the first apply takes the lease before the
-- deployment exists. Times come from the server's clock, so every client agrees on expiry.
CREATE TABLE leases (
    deployment TEXT   COLLATE "C" NOT NULL PRIMARY KEY,
    owner      TEXT   NOT NULL,
    operation  TEXT   NOT NULL,
    token      TEXT   NOT NULL,
    since      BIGINT NOT NULL,
    expires    BIGINT NOT NULL
);
