"""SQLite store: one connection, migrations at start-up, small repositories per table group."""

from core.store.chats import Chat, ChatStore
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage, StoredMessage

__all__ = ["Chat", "ChatStore", "Database", "MessageStore", "NewMessage", "StoredMessage"]
