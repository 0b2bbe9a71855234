-- Announce mode: 1 while a finished run's result waits to be handed to the main agent, 2 once it was.
-- Kept in the run's row, so a restart hands over what waited, and nothing is handed over twice.
ALTER TABLE subagent_runs ADD COLUMN announce_pending INTEGER NOT NULL DEFAULT 0;
