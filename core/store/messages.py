"""Every message the bot can see, and the bounded window the main agent's prompt is built from."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import aiosqlite

from core.store.chat_files import ChatFile, NewFile, chat_file, insert_chat_file
from core.store.db import Database


@dataclass(frozen=True, slots=True)
class NewMessage:
    chat_id: int
    sender_name: str
    content: str
    sender_id: int | None = None
    platform_message_id: int | None = None
    timestamp: float = field(default_factory=time.time)
    is_bot: bool = False
    is_trigger: bool = False
    reply_to: int | None = None
    kind: str = "text"
    edit_of: int | None = None  # an edit: platform id of the message it changes (keys it with edited_at)
    edited_at: float | None = None
    file: NewFile | None = None  # a document, photo, ... it carried (kept by reference)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    chat_id: int
    sender_name: str
    content: str
    sender_id: int | None
    platform_message_id: int | None
    timestamp: float
    is_bot: bool
    is_trigger: bool
    reply_to: int | None
    kind: str
    file: ChatFile | None = None


def _message(row: aiosqlite.Row) -> StoredMessage:
    return StoredMessage(
        id=row["id"],
        chat_id=row["chat_id"],
        sender_name=row["sender_name"],
        content=row["content"],
        sender_id=row["sender_id"],
        platform_message_id=row["platform_message_id"],
        timestamp=row["timestamp"],
        is_bot=bool(row["is_bot"]),
        is_trigger=bool(row["is_trigger"]),
        reply_to=row["reply_to"],
        kind=row["kind"],
        file=chat_file(row, _FILE_PREFIX) if row[f"{_FILE_PREFIX}id"] is not None else None,
    )


_FILE_PREFIX = "file_"
_FILE_COLUMNS = (
    "id",
    "chat_id",
    "message_id",
    "kind",
    "file_id",
    "file_unique_id",
    "name",
    "mime_type",
    "size_bytes",
    "created_at",
    "duration_seconds",
)
# A message with the file it carried, if any (at most one: Telegram sends an album as one message a file).
_SELECT = (
    "SELECT m.*, "
    + ", ".join(f"f.{c} AS {_FILE_PREFIX}{c}" for c in _FILE_COLUMNS)
    + (" FROM messages AS m LEFT JOIN chat_files AS f ON f.message_id = m.id")
)


# Either key can make a row a redelivery: (chat_id, platform_message_id), or an edit's messages_edit_once.
_INSERT = (
    "INSERT INTO messages (chat_id, platform_message_id, sender_id, sender_name, content, timestamp, "
    "is_bot, is_trigger, reply_to, kind, edit_of, edited_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)


def insert_params(message: NewMessage) -> tuple[object, ...]:
    return (
        message.chat_id,
        message.platform_message_id,
        message.sender_id,
        message.sender_name,
        message.content,
        message.timestamp,
        int(message.is_bot),
        int(message.is_trigger),
        message.reply_to,
        message.kind,
    )


async def insert_message(conn: aiosqlite.Connection, message: NewMessage) -> int | None:
    """Insert inside a caller's transaction (with its file, if any); None when this platform message (or
    edit) was stored before."""
    cursor = await conn.execute(_INSERT, (*insert_params(message), message.edit_of, message.edited_at))
    if cursor.rowcount != 1 or cursor.lastrowid is None:
        return None
    if message.file is not None:
        await insert_chat_file(conn, message.chat_id, cursor.lastrowid, message.file)
    return cursor.lastrowid


class MessageStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, message: NewMessage) -> int | None:
        """Store one message; returns its row id, or None if this Telegram message was already stored."""
        async with self._db.write() as conn:
            return await insert_message(conn, message)

    async def recent(self, chat_id: int, limit: int, up_to_id: int | None = None) -> list[StoredMessage]:
        """The last `limit` messages, oldest first: an index walk whose cost does not grow with history."""
        if up_to_id is None:
            query = f"{_SELECT} WHERE m.chat_id = ? ORDER BY m.id DESC LIMIT ?"
            params: tuple[object, ...] = (chat_id, limit)
        else:
            query = f"{_SELECT} WHERE m.chat_id = ? AND m.id <= ? ORDER BY m.id DESC LIMIT ?"
            params = (chat_id, up_to_id, limit)
        async with self._db.conn.execute(query, params) as cursor:
            rows = await cursor.fetchall()
        return [_message(row) for row in reversed(list(rows))]

    async def platform_id_of(self, row_id: int, chat_id: int) -> int | None:
        """The platform id of a stored message of the chat (None: it has none, or no longer has one)."""
        async with self._db.conn.execute(
            "SELECT platform_message_id FROM messages WHERE id = ? AND chat_id = ?", (row_id, chat_id)
        ) as cursor:
            row = await cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    async def get(self, message_id: int) -> StoredMessage | None:
        async with self._db.conn.execute(f"{_SELECT} WHERE m.id = ?", (message_id,)) as cursor:
            row = await cursor.fetchone()
        return _message(row) if row else None

    async def by_platform_id(self, chat_id: int, platform_message_id: int) -> StoredMessage | None:
        """The stored message of the chat with this platform id (e.g. the one a trigger replies to)."""
        async with self._db.conn.execute(
            f"{_SELECT} WHERE m.chat_id = ? AND m.platform_message_id = ?", (chat_id, platform_message_id)
        ) as cursor:
            row = await cursor.fetchone()
        return _message(row) if row else None

    async def mark_trigger(self, row_id: int) -> None:
        """The message asks for a turn after all (a voice note whose words start with the bot's name)."""
        async with self._db.write() as conn:
            await conn.execute("UPDATE messages SET is_trigger = 1 WHERE id = ?", (row_id,))

    async def count(self, chat_id: int | None = None) -> int:
        params: tuple[object, ...] = ()
        if chat_id is None:
            query = "SELECT COUNT(*) FROM messages"
        else:
            query, params = "SELECT COUNT(*) FROM messages WHERE chat_id = ?", (chat_id,)
        async with self._db.conn.execute(query, params) as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0
