-- Issue 13: what each run's container used (for `crewbot stats` and its suggested cap), and settings an
-- operator changed on the running bot (they outlive a restart), with who changed what and when.
ALTER TABLE subagent_runs ADD COLUMN container_started_at REAL;   -- the engine's start returned
ALTER TABLE subagent_runs ADD COLUMN memory_peak_bytes INTEGER;    -- NULL: unknown (no sample, or no peak reported)
ALTER TABLE subagent_runs ADD COLUMN cpu_seconds REAL;             -- NULL: unknown
ALTER TABLE subagent_runs ADD COLUMN resource_samples INTEGER NOT NULL DEFAULT 0;
CREATE INDEX subagent_runs_by_created ON subagent_runs (created_at);

CREATE TABLE setting_overrides (
    name        TEXT PRIMARY KEY,  -- the environment variable's name, e.g. MAX_CONCURRENT_SUBAGENTS
    value       TEXT NOT NULL,     -- as the operator wrote it (validated like a start-up value)
    changed_by  TEXT NOT NULL,
    changed_at  REAL NOT NULL
);

CREATE TABLE setting_changes (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL,
    old_value   TEXT,
    new_value   TEXT NOT NULL,
    changed_by  TEXT NOT NULL,
    changed_at  REAL NOT NULL
);
