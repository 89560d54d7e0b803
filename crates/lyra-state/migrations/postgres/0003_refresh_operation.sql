-- Lyra state, Postgres schema v3: the same as SQLite's 0004 (`refresh` runs, from
-- `lyra drift --refresh-state`). Postgres changes the CHECK in place.
ALTER TABLE runs DROP CONSTRAINT runs_operation_check;
ALTER TABLE runs ADD CONSTRAINT runs_operation_check
    CHECK (operation IN ('apply', 'delete', 'unlock', 'forget', 'import', 'refresh'));
