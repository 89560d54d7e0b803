-- Lyra state, SQLite schema v3: the store's identity, the idempotency key of each pending
-- create, and no credentials left in the history.

-- The store's identity, made once with the store: a random UUID (v4). Idempotency keys begin
-- with it, so two stores never take each other's resources for their own, even under the same
-- deployment name. (A copy of the file is the same store.)
CREATE TABLE store_identity (
    singleton  INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    id         TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

INSERT INTO store_identity (singleton, id, created_at)
SELECT 1,
       lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4'
       || substr(lower(hex(randomblob(2))), 2) || '-'
       || substr('89ab', 1 + abs(random() % 4), 1) || substr(lower(hex(randomblob(2))), 2) || '-'
       || lower(hex(randomblob(6))),
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER);

-- The idempotency key the create of a pending record was (or is about to be) asked with; NULL
-- once the result is recorded. A forgotten record takes its key with it, so no later create
-- can adopt what was made for it.
ALTER TABLE resources ADD COLUMN create_key TEXT;

-- Creates pending from before this version used the old key, `<deployment>/<step id>`.
UPDATE resources SET create_key = deployment || '/' || step_id WHERE pending = 1;

-- `state migrate` used to note the source URL with its query, where a password can be.
UPDATE runs
SET note = substr(note, 1, instr(note, '://') + 2) || '(address removed: it could hold a password)'
WHERE note LIKE '%://%';
