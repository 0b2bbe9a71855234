"""The outbox table: messages owed to chats, in order per chat, with their delivery progress."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import aiosqlite

from core.store.db import Database
from core.store.live_messages import finish_in
from core.store.messages import NewMessage, insert_message


class SentFileKind(StrEnum):
    """How a file goes to the chat: a photo only when its bytes are one Telegram takes as one."""

    PHOTO = "photo"
    DOCUMENT = "document"


@dataclass(frozen=True, slots=True)
class OutgoingFile:
    """A file the chat is owed: kept host-side at `path` (never in a folder a container can write)."""

    path: Path
    name: str  # the name the chat sees, already safe
    kind: SentFileKind


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message to store and send: the stored copy and the exact text the chat gets (a file's caption)."""

    message: NewMessage
    text: str
    run_id: str | None = None  # a subagent's progress message or file: dropped if its run is cancelled first
    reply_to: int | None = None  # the platform message its first part replies to
    file: OutgoingFile | None = None  # sent as one part, with `text` as its caption
    edit_ids: tuple[int, ...] = ()  # a streamed answer: its parts edit these platform messages, in order
    # The turn whose live_messages record this final text ends: deleted in the same transaction, so a record
    # left at start-up is never an answer already owed.
    finishes_live: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    chat_id: int
    text: str
    parts_sent: int
    attempts: int
    next_attempt_at: float
    reply_to: int | None = None
    message_id: int | None = None  # the stored copy (messages.id), if any
    file: OutgoingFile | None = None
    edit_ids: tuple[int, ...] = ()


async def stage(conn: aiosqlite.Connection, outgoing: Outgoing) -> int:
    """Inside the caller's transaction: store the message and owe it to the chat. Returns the outbox id."""
    message_id = await insert_message(conn, outgoing.message)
    now = time.time()
    file = outgoing.file
    cursor = await conn.execute(
        "INSERT INTO outbox (chat_id, message_id, text, next_attempt_at, created_at, run_id, reply_to, "
        "file_path, file_name, file_kind, edit_ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            outgoing.message.chat_id,
            message_id,
            outgoing.text,
            now,
            now,
            outgoing.run_id,
            outgoing.reply_to,
            None if file is None else str(file.path),
            None if file is None else file.name,
            None if file is None else file.kind.value,
            json.dumps(list(outgoing.edit_ids)) if outgoing.edit_ids else None,
        ),
    )
    assert cursor.lastrowid is not None
    if outgoing.finishes_live is not None:
        await finish_in(conn, outgoing.finishes_live)
    return cursor.lastrowid


def _row(row: aiosqlite.Row) -> OutboxRow:
    return OutboxRow(
        id=row["id"],
        chat_id=row["chat_id"],
        text=row["text"],
        parts_sent=row["parts_sent"],
        attempts=row["attempts"],
        next_attempt_at=row["next_attempt_at"],
        reply_to=row["reply_to"],
        message_id=row["message_id"],
        file=None
        if row["file_path"] is None
        else OutgoingFile(Path(row["file_path"]), row["file_name"] or "file", SentFileKind(row["file_kind"])),
        edit_ids=tuple(int(i) for i in json.loads(row["edit_ids"])) if row["edit_ids"] else (),
    )


class OutboxStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, outgoing: Outgoing) -> int:
        async with self._db.transaction() as conn:
            return await stage(conn, outgoing)

    async def pending(self, chat_id: int) -> list[OutboxRow]:
        """The chat's undelivered rows, oldest first (a later one never overtakes an earlier one)."""
        async with self._db.conn.execute(
            "SELECT * FROM outbox WHERE status = 'pending' AND chat_id = ? ORDER BY id", (chat_id,)
        ) as cursor:
            return [_row(row) for row in await cursor.fetchall()]

    async def heads(self) -> list[tuple[int, float]]:
        """Each chat with pending rows and when its oldest one is due: nothing of the chat goes out before."""
        async with self._db.conn.execute(
            "SELECT o.chat_id, o.next_attempt_at FROM outbox AS o JOIN "
            "(SELECT MIN(id) AS id FROM outbox WHERE status = 'pending' GROUP BY chat_id) AS head ON o.id = head.id"
        ) as cursor:
            return [(int(row[0]), float(row[1])) for row in await cursor.fetchall()]

    async def part_sent(self, row_id: int, parts_sent: int, done: bool) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "UPDATE outbox SET parts_sent = ?, status = CASE WHEN ? THEN 'sent' ELSE status END, "
                "sent_at = CASE WHEN ? THEN ? ELSE sent_at END WHERE id = ?",
                (parts_sent, done, done, time.time(), row_id),
            )

    async def set_platform_id(self, message_id: int, platform_id: int) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "UPDATE messages SET platform_message_id = ? WHERE id = ? AND platform_message_id IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.chat_id = messages.chat_id "
                "AND m.platform_message_id = ?)",
                (platform_id, message_id, platform_id),
            )

    async def retry_later(self, row_id: int, attempts: int, next_attempt_at: float, error: str) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "UPDATE outbox SET attempts = ?, next_attempt_at = ?, last_error = ? WHERE id = ?",
                (attempts, next_attempt_at, error[:500], row_id),
            )

    async def give_up(self, row_id: int, error: str) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "UPDATE outbox SET status = 'failed', last_error = ? WHERE id = ?", (error[:500], row_id)
            )

    async def give_up_chat(self, chat_id: int, error: str) -> int:
        """Every pending row of the chat, marked failed with the reason; how many there were."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE outbox SET status = 'failed', last_error = ? WHERE chat_id = ? AND status = 'pending'",
                (error[:500], chat_id),
            )
        return cursor.rowcount

    async def drop_for_run(self, run_id: str, reason: str) -> int:
        """A cancelled run's progress messages not yet sent are not sent: marked failed with the reason."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE outbox SET status = 'failed', last_error = ? WHERE run_id = ? AND status = 'pending' "
                "AND parts_sent = 0",
                (reason[:500], run_id),
            )
        return cursor.rowcount

    async def errors(self) -> list[str]:
        """The distinct reasons recorded on rows that were given up or wait for a retry."""
        async with self._db.conn.execute(
            "SELECT DISTINCT last_error FROM outbox WHERE last_error IS NOT NULL ORDER BY last_error"
        ) as cursor:
            return [str(row[0]) for row in await cursor.fetchall()]

    async def counts(self) -> dict[str, int]:
        async with self._db.conn.execute("SELECT status, COUNT(*) FROM outbox GROUP BY status") as cursor:
            return {str(row[0]): int(row[1]) for row in await cursor.fetchall()}
