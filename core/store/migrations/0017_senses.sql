-- Senses (bot/senses/): images to the main agent, voice to text.
-- A posted file may be a sticker or a round video note too, and audio carries its length as the platform said
-- it. SQLite cannot change a CHECK in place: the table is made anew with the same ids (run_files refers to
-- them; the check of those references waits for the commit, by when every row is back).
PRAGMA defer_foreign_keys = ON;
CREATE TEMP TABLE chat_files_kept AS SELECT * FROM chat_files;
DROP TABLE chat_files;
CREATE TABLE chat_files (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id           INTEGER NOT NULL REFERENCES chats(id),
    message_id        INTEGER NOT NULL REFERENCES messages(id),
    kind              TEXT    NOT NULL CHECK (kind IN ('document', 'photo', 'audio', 'voice', 'video', 'animation',
                                                       'sticker', 'video_note')),
    file_id           TEXT    NOT NULL,
    file_unique_id    TEXT    NOT NULL,
    name              TEXT    NOT NULL,
    mime_type         TEXT,
    size_bytes        INTEGER,
    created_at        REAL    NOT NULL,
    duration_seconds  INTEGER                    -- audio and video: as the platform said (NULL: it did not)
);
-- Inserted after the drop: each row put back resolves the references to it that the drop left pending.
INSERT INTO chat_files (id, chat_id, message_id, kind, file_id, file_unique_id, name, mime_type, size_bytes,
                        created_at)
    SELECT id, chat_id, message_id, kind, file_id, file_unique_id, name, mime_type, size_bytes, created_at
    FROM chat_files_kept;
DROP TABLE chat_files_kept;
CREATE UNIQUE INDEX chat_files_by_message ON chat_files (message_id);
CREATE INDEX chat_files_by_chat ON chat_files (chat_id, id);

-- A voice note's, audio file's or video note's words, transcribed once when it arrived (or why not). The prompt
-- quotes them as the member's words. Retention drops the text after DATA_RETENTION_DAYS.
CREATE TABLE transcripts (
    chat_file_id   INTEGER PRIMARY KEY REFERENCES chat_files(id) ON DELETE CASCADE,
    chat_id        INTEGER NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('pending', 'done', 'failed')),
    text           TEXT    NOT NULL DEFAULT '',   -- done: the words (bounded); failed: empty
    reason         TEXT,                          -- failed: why, one line
    audio_seconds  REAL,                          -- what was sent (and counted), when known
    created_at     REAL    NOT NULL,
    updated_at     REAL    NOT NULL
);
CREATE INDEX transcripts_by_time ON transcripts (updated_at);

-- Speech to text is spend too: its calls and audio seconds per day and chat (kind 'speech'); the tokens it
-- counted in the allowances are its input tokens. The CHECK changes, so the table is made anew.
CREATE TABLE llm_spend_new (
    day              TEXT    NOT NULL,
    chat_id          INTEGER NOT NULL,
    kind             TEXT    NOT NULL CHECK (kind IN ('main', 'announce', 'subagent', 'scheduled', 'speech')),
    input_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens    INTEGER NOT NULL DEFAULT 0,
    calls            INTEGER NOT NULL DEFAULT 0,
    estimated_calls  INTEGER NOT NULL DEFAULT 0,
    audio_seconds    REAL    NOT NULL DEFAULT 0,
    PRIMARY KEY (day, chat_id, kind)
);
INSERT INTO llm_spend_new (day, chat_id, kind, input_tokens, output_tokens, calls, estimated_calls)
    SELECT day, chat_id, kind, input_tokens, output_tokens, calls, estimated_calls FROM llm_spend;
DROP TABLE llm_spend;
ALTER TABLE llm_spend_new RENAME TO llm_spend;
CREATE INDEX llm_spend_by_chat ON llm_spend (chat_id, day);
