-- Streamed answers (bot/agent/live_reply.py), one row each once it is settled: what `crewbot stats` shows of
-- them (crewbot/stream_stats.py): how soon the first words were visible, and how often the answer was edited.
CREATE TABLE streamed_answers (
    id                  INTEGER PRIMARY KEY,
    chat_id             INTEGER NOT NULL,               -- the conversation (no reference: stats outlive a chat)
    settled_at          REAL    NOT NULL,               -- unix seconds
    first_text_seconds  REAL    NOT NULL,               -- the turn's start -> its first words visible
    writing_seconds     REAL    NOT NULL,               -- first words visible -> the last write of the growing text
    edits               INTEGER NOT NULL,               -- writes: the first send, each edit or draft
    draft               INTEGER NOT NULL DEFAULT 0      -- 1: a private chat's draft, 0: a message edited as it grows
);
CREATE INDEX streamed_answers_by_time ON streamed_answers (settled_at, chat_id);
