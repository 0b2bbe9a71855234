-- Main-agent turns (so a spawn request can be traced to, and cancelled with, the turn that made it),
-- subagent runs, and each chat's current subagent session.
CREATE TABLE turns (
    id          TEXT    PRIMARY KEY,
    chat_id     INTEGER NOT NULL REFERENCES chats(id),
    status      TEXT    NOT NULL CHECK (status IN ('running', 'completed', 'aborted', 'failed')),
    started_at  REAL    NOT NULL,
    ended_at    REAL
);
CREATE INDEX turns_by_chat ON turns (chat_id, started_at);

CREATE TABLE subagent_runs (
    id               TEXT    PRIMARY KEY,      -- the spawn request id; a request is run at most once
    chat_id          INTEGER NOT NULL REFERENCES chats(id),
    turn_id          TEXT,
    task             TEXT    NOT NULL,
    label            TEXT    NOT NULL,
    include_context  INTEGER NOT NULL DEFAULT 0,
    status           TEXT    NOT NULL CHECK (status IN ('queued', 'running', 'completed', 'failed',
                                                        'cancelled', 'timed_out', 'rejected', 'interrupted')),
    container_id     TEXT,
    created_at       REAL    NOT NULL,
    started_at       REAL,
    finished_at      REAL,
    result           TEXT,
    error            TEXT,
    input_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens    INTEGER NOT NULL DEFAULT 0,
    llm_requests     INTEGER NOT NULL DEFAULT 0,
    session_in       TEXT,                     -- session the run started from
    session_out      TEXT                      -- session it saved on completion
);
CREATE INDEX subagent_runs_by_chat ON subagent_runs (chat_id, created_at);
CREATE INDEX subagent_runs_by_status ON subagent_runs (status);

CREATE TABLE chat_sessions (
    chat_id     INTEGER PRIMARY KEY REFERENCES chats(id),
    session_id  TEXT    NOT NULL,
    updated_at  REAL    NOT NULL
);

-- Progress messages from subagents, remembered so a rescan never sends one twice.
CREATE TABLE ipc_messages (
    id          TEXT    PRIMARY KEY,
    chat_id     INTEGER NOT NULL REFERENCES chats(id),
    received_at REAL    NOT NULL
);
