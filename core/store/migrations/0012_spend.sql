-- What the bot's LLM calls cost, per day (in TIMEZONE), chat (conversation) and kind of work: the main
-- agent's turns, its announcements, subagent runs and scheduled runs. Every call is counted, whether or not
-- an allowance is set; one whose provider reported no usage is counted from its size and marked estimated.
CREATE TABLE llm_spend (
    day              TEXT    NOT NULL,          -- YYYY-MM-DD in TIMEZONE
    chat_id          INTEGER NOT NULL,
    kind             TEXT    NOT NULL CHECK (kind IN ('main', 'announce', 'subagent', 'scheduled')),
    input_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens    INTEGER NOT NULL DEFAULT 0,
    calls            INTEGER NOT NULL DEFAULT 0,
    estimated_calls  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, chat_id, kind)
);
CREATE INDEX llm_spend_by_chat ON llm_spend (chat_id, day);

-- A chat's own allowance, set by an admin with /budget set (NULL: CHAT_DAILY_TOKENS), and what /budget add
-- gave it for one day.
CREATE TABLE chat_allowances (
    chat_id     INTEGER PRIMARY KEY,
    allowance   INTEGER,                        -- tokens a day; NULL: the setting
    set_by      INTEGER,
    updated_at  REAL    NOT NULL
);
CREATE TABLE chat_allowance_topups (
    chat_id     INTEGER NOT NULL,
    day         TEXT    NOT NULL,
    added       INTEGER NOT NULL,
    PRIMARY KEY (chat_id, day)
);
-- The chat was told it used 80 % of its allowance that day: once a day.
CREATE TABLE allowance_notices (
    chat_id     INTEGER NOT NULL,
    day         TEXT    NOT NULL,
    PRIMARY KEY (chat_id, day)
);
