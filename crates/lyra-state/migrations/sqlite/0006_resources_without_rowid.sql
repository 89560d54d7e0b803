-- Lyra state, SQLite schema v6: `resources` stored in the order of its primary key
-- (WITHOUT ROWID), with no row id.
--
-- A table with a row id keeps its primary key in a second b-tree, so each record written
-- changed two pages (the row, and its entry in the key's index): two WAL frames per commit,
-- and a checkpoint twice as often. Keyed by (deployment, step_id) alone it is one b-tree:
-- one page per record, and a deployment's records are read in step order from adjacent
-- pages. Same columns, in the same order; every row is kept. Nothing references
-- `resources`, so the foreign keys stay valid.
CREATE TABLE resources_v6 (
    deployment  TEXT    NOT NULL REFERENCES deployments (name) ON DELETE CASCADE,
    step_id     TEXT    NOT NULL,
    type_name   TEXT    NOT NULL,
    external_id TEXT    NOT NULL,
    desired     TEXT    NOT NULL, -- JSON object
    actual      TEXT    NOT NULL, -- JSON object
    depends_on  TEXT    NOT NULL, -- JSON array of step ids
    managed     INTEGER NOT NULL CHECK (managed IN (0, 1)),
    updated_at  INTEGER NOT NULL,
    pending     INTEGER NOT NULL DEFAULT 0 CHECK (pending IN (0, 1)),
    sensitive   TEXT    NOT NULL DEFAULT '[]',
    create_key  TEXT,
    PRIMARY KEY (deployment, step_id)
) STRICT, WITHOUT ROWID;

INSERT INTO resources_v6 (deployment, step_id, type_name, external_id, desired, actual, depends_on,
                          managed, updated_at, pending, sensitive, create_key)
SELECT deployment, step_id, type_name, external_id, desired, actual, depends_on, managed, updated_at,
       pending, sensitive, create_key
FROM resources;

DROP TABLE resources;
ALTER TABLE resources_v6 RENAME TO resources;
