-- A chat row is a conversation: a whole chat, or one topic of a forum. Its id is the key everything
-- else uses (history, turns, runs, sessions, workspace folder); where Telegram reaches it is kept apart,
-- so a group upgraded to a supergroup (a new Telegram id) keeps its conversation and nothing moves.
-- platform_chat_id NULL: the row's own id. thread_id NULL: the whole chat (or a forum's General topic).
-- A topic's id is allocated below -(2^53): Telegram ids have at most 52 significant bits, so none clash.
ALTER TABLE chats ADD COLUMN platform_chat_id INTEGER;
ALTER TABLE chats ADD COLUMN thread_id INTEGER;
CREATE UNIQUE INDEX chats_by_address ON chats (COALESCE(platform_chat_id, id), COALESCE(thread_id, 0));

-- Answers are replies: a turn remembers the stored message it answers (messages.id; its platform id is
-- looked up when a reply is sent, so an upgrade that retires the old ids leaves no stale target), and an
-- outbox row the platform message its first part replies to.
ALTER TABLE turns ADD COLUMN trigger_message_id INTEGER;
ALTER TABLE outbox ADD COLUMN reply_to INTEGER;
