-- A human in the loop: every question the bot asks a chat for a run (a subagent's ask_chat, a web host in
-- SUBAGENT_EGRESS=ask mode, a run's approval, an allowance top-up) and its one decision: who, when, what.
-- Stored before it is posted and before its answer takes effect; a button names a question, never a decision.
CREATE TABLE questions (
    id TEXT PRIMARY KEY,              -- the host's random id: a button's callback_data names it
    chat_id INTEGER NOT NULL,
    run_id TEXT,                      -- the run it is for (none for a top-up)
    kind TEXT NOT NULL,               -- ask | egress | approval | topup
    ask_id TEXT,                      -- the container's own id for its question: a retry finds the same one
    text TEXT NOT NULL,
    options TEXT NOT NULL,            -- JSON list of the buttons' labels; [] asks for a reply
    audience TEXT NOT NULL,           -- askers (who asked for the run, and admins) | admins
    status TEXT NOT NULL,             -- open | answered | expired | ended
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    message_id INTEGER,               -- the chat message that shows it
    answer TEXT,                      -- the option's label, or the reply's text
    option INTEGER,                   -- the option's index; NULL for a reply
    answered_by INTEGER,
    answered_by_name TEXT,
    answered_at REAL,
    detail TEXT                       -- why it closed without an answer
);
CREATE UNIQUE INDEX questions_run_ask ON questions (run_id, ask_id) WHERE ask_id IS NOT NULL;
CREATE INDEX questions_run ON questions (run_id, created_at);
CREATE INDEX questions_message ON questions (chat_id, message_id);
CREATE INDEX questions_open ON questions (status, expires_at);

-- SUBAGENT_EGRESS=ask: the hosts a chat's admins allowed "in this chat", added to the operator's allowlist for
-- the chat's runs; /web lists them and admins remove them.
CREATE TABLE chat_egress_allow (
    chat_id INTEGER NOT NULL,
    entry TEXT NOT NULL,
    added_by INTEGER NOT NULL,
    added_by_name TEXT NOT NULL,
    added_at REAL NOT NULL,
    PRIMARY KEY (chat_id, entry)
);
