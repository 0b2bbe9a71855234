"""Notes the main agent keeps: a chat's (its admins' to erase) and each member's about themselves (theirs to see
and erase). Every query names the conversation: a note never crosses into another chat."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import aiosqlite
import structlog

from core.store.db import Database

# structlog's own, as core.logging.get_logger returns it: core.store stays below core (no import cycle).
log: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(__name__)

LOOKUP_BATCH_IDS = 500  # ids per `IN (...)`, well under SQLite's variable limit


@dataclass(frozen=True, slots=True)
class Note:
    id: int
    chat_id: int
    about_user_id: int | None  # None: a chat note
    text: str
    caused_by_id: int | None
    caused_by_name: str
    message_id: int | None  # messages.id it came from
    created_at: float

    @property
    def ref(self) -> str:
        """How the chat and the model name it: `n12`."""
        return f"n{self.id}"


@dataclass(frozen=True, slots=True)
class NewNote:
    chat_id: int
    text: str
    caused_by_id: int | None
    caused_by_name: str
    message_id: int | None = None
    about_user_id: int | None = None
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class MemoryCounts:
    chat_notes: int
    member_notes: int
    chats_off: int


def _note(row: aiosqlite.Row) -> Note:
    return Note(
        id=row["id"],
        chat_id=row["chat_id"],
        about_user_id=row["about_user_id"],
        text=row["text"],
        caused_by_id=row["caused_by_id"],
        caused_by_name=row["caused_by_name"],
        message_id=row["message_id"],
        created_at=row["created_at"],
    )


class NotesFull(Exception):
    """The chat (or the member) has as many notes as allowed."""


class NoteStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def _flush_erased(self) -> bool:
        """After an erase, the WAL that held the erased text is checkpointed away. A reader mid-snapshot (another
        process: `crewbot stats`) can keep it busy: logged, not retried at once (each try holds the one
        connection for the busy timeout, and the same reader would most likely still be there); a later
        checkpoint, SQLite's own or the next erase's, finishes it."""
        if await self._db.flush_erased():
            return True
        log.warning("erased_notes_left_in_wal", hint="a reader kept the WAL busy; a later checkpoint clears it")
        return False

    async def add(self, note: NewNote, limit: int) -> Note:
        """Store a note unless its owner (the chat, or the member it is about) already has `limit`: counted
        and written in one transaction, so racing turns cannot pass the limit together."""
        created_at = note.created_at or time.time()
        async with self._db.transaction() as conn:
            params: tuple[int, ...]
            if note.about_user_id is None:
                where, params = "chat_id = ? AND about_user_id IS NULL", (note.chat_id,)
            else:
                where, params = "chat_id = ? AND about_user_id = ?", (note.chat_id, note.about_user_id)
            async with conn.execute(f"SELECT COUNT(*) FROM notes WHERE {where}", params) as cursor:
                row = await cursor.fetchone()
            if row is not None and int(row[0]) >= limit:
                raise NotesFull(f"{int(row[0])} notes kept, at most {limit}")
            cursor = await conn.execute(
                "INSERT INTO notes (chat_id, about_user_id, text, caused_by_id, caused_by_name, message_id, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    note.chat_id,
                    note.about_user_id,
                    note.text,
                    note.caused_by_id,
                    note.caused_by_name,
                    note.message_id,
                    created_at,
                ),
            )
            note_id = cursor.lastrowid
        assert note_id is not None
        return Note(
            note_id,
            note.chat_id,
            note.about_user_id,
            note.text,
            note.caused_by_id,
            note.caused_by_name,
            note.message_id,
            created_at,
        )

    async def chat_notes(self, chat_id: int, limit: int) -> list[Note]:
        """The chat's notes, newest first."""
        async with self._db.conn.execute(
            "SELECT * FROM notes WHERE chat_id = ? AND about_user_id IS NULL ORDER BY id DESC LIMIT ?",
            (chat_id, limit),
        ) as cursor:
            return [_note(row) for row in await cursor.fetchall()]

    async def member_notes(self, chat_id: int, user_ids: Iterable[int], limit_each: int) -> list[Note]:
        """The notes about these members in this chat, newest first (at most `limit_each` a member)."""
        ids = sorted(set(user_ids))
        found: list[Note] = []
        for start in range(0, len(ids), LOOKUP_BATCH_IDS):
            chunk = ids[start : start + LOOKUP_BATCH_IDS]
            marks = ", ".join("?" for _ in chunk)
            async with self._db.conn.execute(
                f"SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY about_user_id ORDER BY id DESC) AS n "
                f"FROM notes WHERE chat_id = ? AND about_user_id IN ({marks})) WHERE n <= ? ORDER BY id DESC",
                (chat_id, *chunk, limit_each),
            ) as cursor:
                found += [_note(row) for row in await cursor.fetchall()]
        return sorted(found, key=lambda note: note.id, reverse=True)

    async def get(self, chat_id: int, note_id: int) -> Note | None:
        async with self._db.conn.execute(
            "SELECT * FROM notes WHERE id = ? AND chat_id = ?", (note_id, chat_id)
        ) as cursor:
            row = await cursor.fetchone()
        return _note(row) if row else None

    async def delete(self, chat_id: int, note_id: int) -> bool:
        """Erase one note of this chat (its text overwritten on disk: core/store/db.py sets secure_delete)."""
        async with self._db.write() as conn:
            cursor = await conn.execute("DELETE FROM notes WHERE id = ? AND chat_id = ?", (note_id, chat_id))
        erased = cursor.rowcount == 1
        if erased:
            await self._flush_erased()
        return erased

    async def forget_member(self, chat_ids: Iterable[int], user_id: int) -> int:
        """Everything kept about a member in these chats (a group and its forum topics), in one write: the
        notes about them and the chat notes they caused. Really deleted: secure_delete zeroes the freed bytes,
        and the WAL that held them is checkpointed away."""
        ids = sorted(set(chat_ids))
        erased = 0
        async with self._db.write() as conn:
            for start in range(0, len(ids), LOOKUP_BATCH_IDS):
                chunk = ids[start : start + LOOKUP_BATCH_IDS]
                marks = ", ".join("?" for _ in chunk)
                cursor = await conn.execute(
                    f"DELETE FROM notes WHERE chat_id IN ({marks}) AND (about_user_id = ? OR caused_by_id = ?)",
                    (*chunk, user_id, user_id),
                )
                erased += cursor.rowcount
        if erased:
            await self._flush_erased()
        return erased

    async def set_off(self, chat_id: int, off: bool, by: str) -> bool:
        """Turn notes off (or on again) for a chat; False when it already was so."""
        async with self._db.write() as conn:
            if off:
                cursor = await conn.execute(
                    "INSERT INTO memory_off (chat_id, off_at, off_by) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                    (chat_id, time.time(), by),
                )
            else:
                cursor = await conn.execute("DELETE FROM memory_off WHERE chat_id = ?", (chat_id,))
        return cursor.rowcount == 1

    async def is_off(self, chat_id: int) -> bool:
        async with self._db.conn.execute("SELECT 1 FROM memory_off WHERE chat_id = ?", (chat_id,)) as cursor:
            return await cursor.fetchone() is not None

    async def counts(self, chat_id: int | None = None) -> MemoryCounts:
        """Notes kept and chats with notes off: all chats', or one's."""
        where, params = ("", ()) if chat_id is None else (" WHERE chat_id = ?", (chat_id,))
        async with self._db.conn.execute(
            "SELECT COALESCE(SUM(about_user_id IS NULL), 0), COALESCE(SUM(about_user_id IS NOT NULL), 0) "
            f"FROM notes{where}",
            params,
        ) as cursor:
            row = await cursor.fetchone()
        async with self._db.conn.execute(f"SELECT COUNT(*) FROM memory_off{where}", params) as cursor:
            off = await cursor.fetchone()
        return MemoryCounts(int(row[0]) if row else 0, int(row[1]) if row else 0, int(off[0]) if off else 0)

    async def prune_off(self, cutoff: float) -> int:
        """Retention: the notes of chats whose memory was turned off before `cutoff` (seconds) are deleted."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "DELETE FROM notes WHERE chat_id IN (SELECT chat_id FROM memory_off WHERE off_at < ?)", (cutoff,)
            )
        if cursor.rowcount:
            await self._flush_erased()
        return cursor.rowcount
