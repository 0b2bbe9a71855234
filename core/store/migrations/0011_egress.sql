-- The web through the door: each connection a run asked for (allowed or refused, and why), its bytes each
-- way, for /subagents, logs, stats and the metrics; a hostile run's flood of attempts is recorded up to a
-- cap (the run's totals still count them all).
CREATE TABLE egress_connections (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT    NOT NULL REFERENCES subagent_runs(id),
    chat_id     INTEGER NOT NULL REFERENCES chats(id),
    host        TEXT    NOT NULL,              -- as the client asked for it
    port        INTEGER NOT NULL,
    address     TEXT,                          -- the address connected to (NULL: refused before)
    allowed     INTEGER NOT NULL,
    reason      TEXT    NOT NULL DEFAULT '',   -- refused: why; allowed: why it was cut, if it was
    bytes_up    INTEGER NOT NULL DEFAULT 0,    -- from the container
    bytes_down  INTEGER NOT NULL DEFAULT 0,    -- to the container
    started_at  REAL    NOT NULL,
    ended_at    REAL    NOT NULL
);
CREATE INDEX egress_by_run ON egress_connections (run_id, id);
CREATE INDEX egress_by_time ON egress_connections (started_at);

-- A run's totals through the door, all its connections counted (also those past the recording cap).
ALTER TABLE subagent_runs ADD COLUMN egress_bytes_up INTEGER NOT NULL DEFAULT 0;
ALTER TABLE subagent_runs ADD COLUMN egress_bytes_down INTEGER NOT NULL DEFAULT 0;
ALTER TABLE subagent_runs ADD COLUMN egress_connections INTEGER NOT NULL DEFAULT 0;
ALTER TABLE subagent_runs ADD COLUMN egress_refused INTEGER NOT NULL DEFAULT 0;
