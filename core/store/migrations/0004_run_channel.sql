-- The run channel: a run's progress messages are counted against its budget, owed messages know their
-- run (a cancel drops what the run queued), and a refusal is remembered until its chat was told.
ALTER TABLE subagent_runs ADD COLUMN messages_sent INTEGER NOT NULL DEFAULT 0;
ALTER TABLE subagent_runs ADD COLUMN notified INTEGER NOT NULL DEFAULT 1;  -- 0: a refusal not yet told
ALTER TABLE outbox ADD COLUMN run_id TEXT;                                  -- the run a progress message is from
CREATE INDEX outbox_by_run ON outbox (run_id) WHERE run_id IS NOT NULL;
-- Progress messages are keyed by their run: the container's id for a message makes a retry idempotent.
ALTER TABLE ipc_messages ADD COLUMN run_id TEXT;
