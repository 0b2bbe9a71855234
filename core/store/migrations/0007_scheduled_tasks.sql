-- Scheduled tasks and each due time they reached. The database is the truth: the scheduler is rebuilt
-- from it at start, and a due time runs only after its row in task_fires is inserted (UNIQUE claim).
ALTER TABLE chats ADD COLUMN timezone TEXT;         -- IANA name set with /timezone; NULL: the TIMEZONE setting

CREATE TABLE scheduled_tasks (
    id             TEXT    PRIMARY KEY,
    chat_id        INTEGER NOT NULL REFERENCES chats(id),
    creator_id     INTEGER,                          -- who asked for it: may pause, resume and cancel it
    label          TEXT    NOT NULL,
    prompt         TEXT    NOT NULL,
    schedule       TEXT    NOT NULL,                 -- as written: cron, `every <N><unit>` or an ISO date-time
    timezone       TEXT    NOT NULL,                 -- the zone the schedule is read in
    mode           TEXT    NOT NULL CHECK (mode IN ('subagent', 'message')),
    status         TEXT    NOT NULL CHECK (status IN ('active', 'paused', 'completed', 'cancelled')),
    status_reason  TEXT,
    next_due_at    REAL,                             -- unix seconds; NULL once nothing is due any more
    failures       INTEGER NOT NULL DEFAULT 0,       -- failed runs in a row
    backoff_until  REAL,                             -- due times before this are skipped after a failure
    created_at     REAL    NOT NULL,
    updated_at     REAL    NOT NULL
);
CREATE INDEX scheduled_tasks_by_chat ON scheduled_tasks (chat_id, status);
CREATE INDEX scheduled_tasks_by_status ON scheduled_tasks (status);

CREATE TABLE task_fires (
    id           INTEGER PRIMARY KEY,
    task_id      TEXT    NOT NULL REFERENCES scheduled_tasks(id),
    due_at       REAL    NOT NULL,
    status       TEXT    NOT NULL CHECK (status IN ('claimed', 'waiting', 'starting', 'running', 'done',
                                                    'failed', 'skipped', 'interrupted')),
    run_id       TEXT,                               -- the subagent run it started (mode subagent)
    detail       TEXT,                               -- why it failed or was skipped
    claimed_at   REAL    NOT NULL,
    finished_at  REAL,
    UNIQUE (task_id, due_at)                         -- the claim: one row, so one run, per due time
);
CREATE INDEX task_fires_by_status ON task_fires (status);
