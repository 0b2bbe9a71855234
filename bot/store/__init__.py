"""SQLite store: one connection, migrations at start-up, small repositories per table group."""

from bot.store.chats import Chat, ChatStore
from bot.store.db import Database
from bot.store.messages import MessageStore, NewMessage, StoredMessage

__all__ = ["Chat", "ChatStore", "Database", "MessageStore", "NewMessage", "StoredMessage"]
