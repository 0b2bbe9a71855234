-- What the bot owes its chats. A message and its outbox row are written in one transaction; the row is
-- marked sent part by part (a long reply goes out in several Telegram messages), so a crash neither
-- loses a message nor sends a part twice (short of the moment between Telegram's answer and our write).
CREATE TABLE outbox (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id          INTEGER NOT NULL REFERENCES chats(id),
    message_id       INTEGER REFERENCES messages(id),   -- the stored copy the prompt sees
    text             TEXT    NOT NULL,                  -- exactly what the chat is sent
    status           TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
    parts_sent       INTEGER NOT NULL DEFAULT 0,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  REAL    NOT NULL,
    last_error       TEXT,
    created_at       REAL    NOT NULL,
    sent_at          REAL
);
CREATE INDEX outbox_pending ON outbox (status, chat_id, id);
