-- Streamed replies (bot/channels/live_message.py). An answer shown while it was written is delivered by
-- editing the messages that showed it: their platform ids, one per part, in order (JSON list).
ALTER TABLE outbox ADD COLUMN edit_ids TEXT;

-- A growing answer on the chat's screen, until its final text is owed through the outbox (then the row
-- goes). One left after a crash is marked interrupted at the next start, and its turn answered into it.
CREATE TABLE live_messages (
    turn_id TEXT PRIMARY KEY,
    chat_id INTEGER NOT NULL,
    platform_ids TEXT NOT NULL DEFAULT '[]',   -- JSON list of the parts' platform message ids
    shown_text TEXT NOT NULL DEFAULT '',       -- the text last shown (Markdown, without the name)
    trigger_message_id INTEGER,                -- the message it answers (messages.id)
    started_at REAL NOT NULL
);
CREATE INDEX live_messages_by_chat ON live_messages (chat_id);
