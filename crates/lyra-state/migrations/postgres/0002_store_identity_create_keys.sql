-- Lyra state, Postgres schema v2: the same as SQLite's 0003 (the store's identity, the
-- idempotency key of each pending create, no credentials left in the history).

-- The store's identity, made once with the store (each schema is a store of its own).
-- Idempotency keys begin with it, so two stores never take each other's resources for their
-- own, even under the same deployment name.
CREATE TABLE store_identity (
    singleton  BOOLEAN NOT NULL PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    id         TEXT    NOT NULL,
    created_at BIGINT  NOT NULL
);

INSERT INTO store_identity (singleton, id, created_at)
VALUES (TRUE, gen_random_uuid()::text, (extract(epoch from clock_timestamp()) * 1000)::bigint);

-- The idempotency key the create of a pending record was (or is about to be) asked with; NULL
-- once the result is recorded.
ALTER TABLE resources ADD COLUMN create_key TEXT;

-- Creates pending from before this version used the old key, `<deployment>/<step id>`.
UPDATE resources SET create_key = deployment || '/' || step_id WHERE pending;

-- `state migrate` used to note the source URL with its query, where a password can be.
UPDATE runs
SET note = substr(note, 1, strpos(note, '://') + 2) || '(address removed: it could hold a password)'
WHERE note LIKE '%://%';
