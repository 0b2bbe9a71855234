-- Memory (docs/using.md "Memory"): a chat's notes, what members told the bot about themselves, and a full-text
-- index of every stored message for the main agent's search_history tool (core/store/history.py).
CREATE TABLE notes (
    id              INTEGER PRIMARY KEY,
    chat_id         INTEGER NOT NULL REFERENCES chats(id),  -- the conversation: a note never leaves it
    about_user_id   INTEGER,            -- NULL: a chat note; else a member note, about this member (who said it)
    text            TEXT    NOT NULL,
    caused_by_id    INTEGER,            -- who asked for it (NULL: a scheduled prompt or an announcement)
    caused_by_name  TEXT    NOT NULL,
    message_id      INTEGER,            -- messages.id of the message it came from, so the agent can cite it
    created_at      REAL    NOT NULL    -- unix seconds
);
CREATE INDEX notes_by_chat ON notes (chat_id, about_user_id, id);
CREATE INDEX notes_by_causer ON notes (chat_id, caused_by_id);

-- `/memory off` (chat admins): notes are neither shown nor written while a row is here; kept for
-- DATA_RETENTION_DAYS after it was turned off (runner/storage/retention.py), then deleted.
CREATE TABLE memory_off (
    chat_id  INTEGER PRIMARY KEY REFERENCES chats(id),
    off_at   REAL    NOT NULL,       -- unix seconds
    off_by   TEXT    NOT NULL
);

-- Trigrams match any language (words, CJK without spaces, parts of words) without knowing which; the text
-- stays in `messages` only (external content), so the index adds its postings, not a second copy.
CREATE VIRTUAL TABLE messages_fts USING fts5(
    content, content = 'messages', content_rowid = 'id', tokenize = 'trigram case_sensitive 0'
);
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts (messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts (rowid, content) VALUES (new.id, new.content);
END;
-- The messages stored before this version.
INSERT INTO messages_fts (messages_fts) VALUES ('rebuild');
