-- Streamed replies (bot/channels/live_message.py). An answer shown while it was written is delivered by
-- editing the messages that showed it: their platform ids, one per part, in order (JSON list).
ALTER TABLE outbox ADD COLUMN edit_ids TEXT;

