-- An edit is stored under the message it changes and its edit time: a redelivered edit (same message,
-- same edit_date, same text) is stored once. Its platform_message_id stays NULL so the original's row
-- keeps the (chat_id, platform_message_id) key.
ALTER TABLE messages ADD COLUMN edit_of INTEGER;   -- platform id of the message an edit changes
ALTER TABLE messages ADD COLUMN edited_at REAL;    -- the edit's time (Telegram's edit_date), unix seconds
-- The text is part of the key: edit_date has one-second resolution, and two edits in one second differ.
CREATE UNIQUE INDEX messages_edit_once ON messages (chat_id, edit_of, edited_at, content) WHERE edit_of IS NOT NULL;
