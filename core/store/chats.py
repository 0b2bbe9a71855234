"""Chats the bot has seen, each with the folder name used for its IPC and workspace directories."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import aiosqlite

from core.store.db import Database


def folder_for_chat(chat_id: int) -> str:
    """A filesystem-safe, stable folder name: `chat_123` or `chat_m100123` for negative group ids."""
    return f"chat_{'m' if chat_id < 0 else ''}{abs(chat_id)}"


# Topics get ids beyond every Telegram id (those have at most 52 significant bits), counting down.
TOPIC_ID_CEILING = -(2**53)
# Chats remembered as last written, the most recently seen kept: a chat beyond them pays one upsert at its next
# message, as a new chat does. About 350 bytes each; without a bound a bot in many chats kept every one for good.
WRITTEN_CHATS_KEPT = 2_048


@dataclass(frozen=True, slots=True)
class ChatAddress:
    """Where the platform reaches a conversation: the chat, and the forum topic within it if any."""

    platform_chat_id: int
    thread_id: int | None = None


_ADDRESS = "COALESCE(platform_chat_id, id) = ? AND COALESCE(thread_id, 0) = ?"


@dataclass(frozen=True, slots=True)
class Chat:
    id: int
    kind: str
    title: str | None
    folder: str
    platform_chat_id: int | None = None  # the platform's chat when it is not `id` (a topic, an upgrade)

    @property
    def platform_id(self) -> int:
        return self.id if self.platform_chat_id is None else self.platform_chat_id


def _chat(row: aiosqlite.Row) -> Chat:
    return Chat(
        id=row["id"],
        kind=row["kind"],
        title=row["title"],
        folder=row["folder"],
        platform_chat_id=row["platform_chat_id"],
    )


class ChatStore:
    def __init__(self, db: Database, *, kept: int = WRITTEN_CHATS_KEPT) -> None:
        self._db = db
        self._kept = kept
        # Chats as last written, least recently seen first: most messages need no write at all.
        self._written: OrderedDict[int, Chat] = OrderedDict()

    async def ensure(self, chat_id: int, kind: str, title: str | None) -> Chat:
        """Record the chat the first time it is seen; keep its title current afterwards."""
        known = self._written.get(chat_id)
        if known is not None and known.kind == kind and known.title == title:
            self._written.move_to_end(chat_id)
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
        self._written.move_to_end(chat_id)
        while len(self._written) > self._kept:
            self._written.popitem(last=False)
        return chat

    async def get(self, chat_id: int) -> Chat | None:
        async with self._db.conn.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)) as cursor:
            row = await cursor.fetchone()
        return _chat(row) if row else None

    async def by_folder(self, folder: str) -> Chat | None:
        async with self._db.conn.execute("SELECT * FROM chats WHERE folder = ?", (folder,)) as cursor:
            row = await cursor.fetchone()
        return _chat(row) if row else None

    # --- addresses: conversations as the platform sees them ------------------------------------

    async def resolve(self, platform_chat_id: int, thread_id: int | None, kind: str, title: str | None) -> int:
        """The conversation id for a chat (and topic): the chat's own id the first time it is seen, a
        new topic id below TOPIC_ID_CEILING for a topic, or what an upgrade left (the old group's id)."""
        found = await self._by_address(platform_chat_id, thread_id)
        if found is not None:
            return found
        if thread_id is None:
            return platform_chat_id  # `ensure` records it with the first message
        async with self._db.write() as conn:
            async with conn.execute("SELECT MIN(id) FROM chats WHERE id <= ?", (TOPIC_ID_CEILING,)) as cursor:
                row = await cursor.fetchone()
            lowest = row[0] if row and row[0] is not None else TOPIC_ID_CEILING
            topic_id = int(lowest) - 1
            await conn.execute(
                "INSERT INTO chats (id, kind, title, folder, created_at, platform_chat_id, thread_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (topic_id, kind, title, folder_for_chat(topic_id), time.time(), platform_chat_id, thread_id),
            )
        return topic_id

    async def _by_address(self, platform_chat_id: int, thread_id: int | None) -> int | None:
        async with self._db.conn.execute(
            f"SELECT id FROM chats WHERE {_ADDRESS}", (platform_chat_id, thread_id or 0)
        ) as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else None

    async def address(self, chat_id: int) -> ChatAddress:
        """Where to send to the conversation; a chat never recorded is its own address."""
        async with self._db.conn.execute(
            "SELECT COALESCE(platform_chat_id, id), thread_id FROM chats WHERE id = ?", (chat_id,)
        ) as cursor:
            row = await cursor.fetchone()
        if row is None:
            return ChatAddress(chat_id)
        return ChatAddress(int(row[0]), None if row[1] is None else int(row[1]))

    async def allowed(self, chat_id: int, listed: Callable[[int], bool]) -> bool:
        """Whether the allow-list (`listed`: ALLOWED_CHAT_IDS) lets a conversation in. The console always;
        otherwise any id it may be named by: its own, its platform chat's, and the id of that chat's
        whole-chat conversation (a group's old id after an upgrade, for a topic made since)."""
        if listed(chat_id):
            return True
        chat = await self.get(chat_id)
        if chat is not None and chat.kind == "console":
            return True
        address = await self.address(chat_id)
        whole = await self._by_address(address.platform_chat_id, None)
        return listed(address.platform_chat_id) or (whole is not None and listed(whole))

    async def conversations_of(self, platform_chat_id: int) -> list[int]:
        """Every conversation in a platform chat: the chat itself and each of its topics."""
        async with self._db.conn.execute(
            "SELECT id FROM chats WHERE COALESCE(platform_chat_id, id) = ? ORDER BY id DESC", (platform_chat_id,)
        ) as cursor:
            return [int(row[0]) for row in await cursor.fetchall()]

    async def migrate(self, old_platform_id: int, new_platform_id: int) -> list[int]:
        """A group became a supergroup: its conversations are reached at the new id from now on, in one
        write. Returns them (none when already done, or when the new id has a conversation of its own)."""
        async with self._db.write() as conn:
            async with conn.execute(
                "SELECT COUNT(*) FROM chats WHERE COALESCE(platform_chat_id, id) = ?", (new_platform_id,)
            ) as cursor:
                taken = (await cursor.fetchone() or (0,))[0]
            if taken:
                return []
            async with conn.execute(
                "SELECT id FROM chats WHERE COALESCE(platform_chat_id, id) = ?", (old_platform_id,)
            ) as cursor:
                moved = [int(row[0]) for row in await cursor.fetchall()]
            await conn.execute(
                "UPDATE chats SET platform_chat_id = ? WHERE COALESCE(platform_chat_id, id) = ?",
                (new_platform_id, old_platform_id),
            )
            # The supergroup numbers its messages afresh: the old group's ids name nothing there any more,
            # and kept they would make its new messages look like redeliveries of old ones.
            await conn.executemany(
                "UPDATE messages SET platform_message_id = NULL WHERE chat_id = ? AND platform_message_id IS NOT NULL",
                [(chat_id,) for chat_id in moved],
            )
            # What is owed would otherwise reply to whatever message of the supergroup now has that id.
            await conn.executemany(
                "UPDATE outbox SET reply_to = NULL WHERE chat_id = ? AND status = 'pending'",
                [(chat_id,) for chat_id in moved],
            )
        return moved
