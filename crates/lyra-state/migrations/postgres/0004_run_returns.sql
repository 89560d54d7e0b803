-- Lyra state, Postgres schema v4: the same as SQLite's 0005 (a succeeded apply keeps the
-- workflow's returns in its run, for `lyra output`).
ALTER TABLE runs ADD COLUMN returns TEXT;
