-- Files. A file posted in a chat is kept by reference (Telegram's ids, its name, type and size) with the
-- message that carried it; the prompt names it `f<id>`. Its bytes are fetched only when a run needs them.
CREATE TABLE chat_files (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id         INTEGER NOT NULL REFERENCES chats(id),
    message_id      INTEGER NOT NULL REFERENCES messages(id),
    kind            TEXT    NOT NULL CHECK (kind IN ('document', 'photo', 'audio', 'voice', 'video', 'animation')),
    file_id         TEXT    NOT NULL,            -- what getFile takes
    file_unique_id  TEXT    NOT NULL,            -- the same for the same file, in any chat: one download each
    name            TEXT    NOT NULL,            -- as posted (the prompt and the inbox make it safe)
    mime_type       TEXT,
    size_bytes      INTEGER,                     -- NULL: the platform did not say
    created_at      REAL    NOT NULL
);
CREATE UNIQUE INDEX chat_files_by_message ON chat_files (message_id);
CREATE INDEX chat_files_by_chat ON chat_files (chat_id, id);

-- The files a run was given and the files it sent, for /subagents, logs, stats and retention. A file out
-- is kept host-side under DATA_DIR/files/out until it was sent and its retention has passed; its outbox
-- row carries it to the chat exactly once.
CREATE TABLE run_files (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id        TEXT    NOT NULL REFERENCES subagent_runs(id),
    chat_id       INTEGER NOT NULL REFERENCES chats(id),
    direction     TEXT    NOT NULL CHECK (direction IN ('in', 'out')),
    name          TEXT    NOT NULL,              -- in: as written to the inbox; out: as sent
    size_bytes    INTEGER NOT NULL,
    kind          TEXT    NOT NULL,              -- in: the chat file's kind; out: photo or document
    chat_file_id  INTEGER REFERENCES chat_files(id),
    upload_id     TEXT,                          -- out: the container's id for it (a retry is a duplicate)
    stored        TEXT,                          -- out: its path under DATA_DIR
    created_at    REAL    NOT NULL
);
CREATE INDEX run_files_by_run ON run_files (run_id, direction);
CREATE UNIQUE INDEX run_files_upload ON run_files (run_id, upload_id) WHERE upload_id IS NOT NULL;

-- What a spawn request named of its chat's files, and what a scheduled task names each time it is due.
ALTER TABLE subagent_runs ADD COLUMN files TEXT NOT NULL DEFAULT '[]';   -- JSON list of refs: ["f3"]
ALTER TABLE scheduled_tasks ADD COLUMN files TEXT NOT NULL DEFAULT '[]';

-- An outbox row may carry a file: `text` is then its caption, and the file is sent in one part.
ALTER TABLE outbox ADD COLUMN file_path TEXT;     -- under DATA_DIR, host-only
ALTER TABLE outbox ADD COLUMN file_name TEXT;
ALTER TABLE outbox ADD COLUMN file_kind TEXT;     -- photo or document
