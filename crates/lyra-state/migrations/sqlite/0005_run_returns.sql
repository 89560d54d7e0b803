-- Lyra state, SQLite schema v5: a succeeded apply keeps the workflow's returns in its run, for
-- `lyra output`. JSON object {values, sensitive}; NULL for every other run and for runs
-- recorded before this version.
ALTER TABLE runs ADD COLUMN returns TEXT;
