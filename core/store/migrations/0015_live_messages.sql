-- A growing answer on screen (bot/channels/live_message.py), recorded from its first message until its final
-- text is owed to the chat: the record is deleted in the transaction that stores the final outbox row, so a
-- record found at start-up is an answer a crash cut short (finished or answered into by the next start).
CREATE TABLE live_messages (
    turn_id             TEXT    PRIMARY KEY,                 -- the turn writing it (a merge hands it on)
    chat_id             INTEGER NOT NULL REFERENCES chats(id),
    trigger_message_id  INTEGER,                             -- messages.id of the message it answers
    part_ids            TEXT    NOT NULL,                    -- platform ids of its parts, in order (JSON list)
    text                TEXT    NOT NULL DEFAULT '',         -- the text shown, without the assistant's name
    created_at          REAL    NOT NULL,                    -- unix seconds
    updated_at          REAL    NOT NULL
);
CREATE INDEX live_messages_by_chat ON live_messages (chat_id, created_at);
