-- Chats the bot has seen and every message it can see in them.
CREATE TABLE chats (
    id          INTEGER PRIMARY KEY,          -- Telegram chat id, or the console's local chat id
    kind        TEXT    NOT NULL,             -- private, group, supergroup, channel, console
    title       TEXT,
    folder      TEXT    NOT NULL UNIQUE,      -- name of the chat's IPC and workspace folders
    created_at  REAL    NOT NULL              -- unix seconds
);

CREATE TABLE messages (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id              INTEGER NOT NULL REFERENCES chats(id),
    platform_message_id  INTEGER,             -- Telegram's id; NULL for messages that have none
    sender_id            INTEGER,
    sender_name          TEXT    NOT NULL,
    content              TEXT    NOT NULL,
    timestamp            REAL    NOT NULL,    -- unix seconds
    is_bot               INTEGER NOT NULL DEFAULT 0,   -- sent by this bot: never triggers a turn
    is_trigger           INTEGER NOT NULL DEFAULT 0,   -- asked the bot for a turn
    reply_to             INTEGER,             -- platform id of the message this one replies to
    kind                 TEXT    NOT NULL DEFAULT 'text',  -- text, placeholder, edit, reply, subagent, notice
    UNIQUE (chat_id, platform_message_id)     -- a redelivered update is stored once
);

CREATE INDEX messages_by_chat ON messages (chat_id, id);
