"""Chats the bot has seen, each with the folder name used for its IPC and workspace directories."""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiosqlite

from core.store.db import Database


def folder_for_chat(chat_id: int) -> str:
    """A filesystem-safe, stable folder name: `chat_123` or `chat_m100123` for negative group ids."""
    return f"chat_{'m' if chat_id < 0 else ''}{abs(chat_id)}"


@dataclass(frozen=True, slots=True)
class Chat:
    id: int
    kind: str
    title: str | None
    folder: str


def _chat(row: aiosqlite.Row) -> Chat:
    return Chat(id=row["id"], kind=row["kind"], title=row["title"], folder=row["folder"])


class ChatStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._written: dict[int, Chat] = {}  # chats as last written: most messages need no write at all

    async def ensure(self, chat_id: int, kind: str, title: str | None) -> Chat:
        """Record the chat the first time it is seen; keep its title current afterwards."""
        known = self._written.get(chat_id)
        if known is not None and known.kind == kind and known.title == title:
            return known
        async with self._db.write() as conn:
            await conn.execute(
                "INSERT INTO chats (id, kind, title, folder, created_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET title = excluded.title, kind = excluded.kind",
                (chat_id, kind, title, folder_for_chat(chat_id), time.time()),
            )
        chat = await self.get(chat_id)
        assert chat is not None
        self._written[chat_id] = chat
        return chat

    async def get(self, chat_id: int) -> Chat | None:
        async with self._db.conn.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)) as cursor:
            row = await cursor.fetchone()
        return _chat(row) if row else None

    async def by_folder(self, folder: str) -> Chat | None:
        async with self._db.conn.execute("SELECT * FROM chats WHERE folder = ?", (folder,)) as cursor:
            row = await cursor.fetchone()
        return _chat(row) if row else None
