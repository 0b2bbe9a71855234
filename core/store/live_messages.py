"""Growing answers on screen, recorded until their final text is owed (migration 0015 says why)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import aiosqlite

from core.store.db import Database


@dataclass(frozen=True, slots=True)
class LiveRecord:
    """A growing answer's message(s) as last recorded."""

    turn_id: str
    chat_id: int
    trigger_message_id: int | None
    part_ids: tuple[int, ...]
    text: str
    created_at: float  # unix seconds


async def finish_in(conn: aiosqlite.Connection, turn_id: str) -> None:
    """Inside the caller's transaction (the one that owes the answer's final text): the record is done."""
    await conn.execute("DELETE FROM live_messages WHERE turn_id = ?", (turn_id,))


def _record(row: aiosqlite.Row) -> LiveRecord:
    trigger = row["trigger_message_id"]
    return LiveRecord(
        turn_id=str(row["turn_id"]),
        chat_id=int(row["chat_id"]),
        trigger_message_id=None if trigger is None else int(trigger),
        part_ids=tuple(int(i) for i in json.loads(row["part_ids"])),
        text=str(row["text"]),
        created_at=float(row["created_at"]),
    )


class LiveMessageStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def save(
        self, turn_id: str, chat_id: int, trigger_message_id: int | None, part_ids: tuple[int, ...], text: str
    ) -> None:
        """Record the answer's parts and text now (a new record, or the turn's record brought up to date)."""
        now = time.time()
        async with self._db.write() as conn:
            await conn.execute(
                "INSERT INTO live_messages (turn_id, chat_id, trigger_message_id, part_ids, text, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (turn_id) DO UPDATE SET "
                "part_ids = excluded.part_ids, text = excluded.text, updated_at = excluded.updated_at",
                (turn_id, chat_id, trigger_message_id, json.dumps(list(part_ids)), text, now, now),
            )

    async def hand_over(self, from_turn: str, to_turn: str, trigger_message_id: int | None) -> bool:
        """A merge's next turn writes into the aborted turn's message: the record becomes that turn's."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE live_messages SET turn_id = ?, trigger_message_id = COALESCE(?, trigger_message_id), "
                "updated_at = ? WHERE turn_id = ?",
                (to_turn, trigger_message_id, time.time(), from_turn),
            )
        return cursor.rowcount == 1

    async def drop(self, turn_id: str) -> None:
        async with self._db.write() as conn:
            await finish_in(conn, turn_id)

    async def started_work(self, record: LiveRecord) -> bool:
        """Whether the answer's turn started a subagent run or scheduled a task: answering its trigger again
        would likely do it twice (bot/agent/live_restart.py). Turns of a chat run one at a time, so the
        chat's runs spawned by a turn, and its tasks, since the answer's turn began (or since its message
        was first recorded, for a turn it was handed over from by a merge) are that answer's."""
        async with self._db.conn.execute(
            "SELECT MIN(COALESCE((SELECT started_at FROM turns WHERE id = ?), ?), ?)",
            (record.turn_id, record.created_at, record.created_at),
        ) as cursor:
            row = await cursor.fetchone()
        since = float(row[0]) if row is not None else record.created_at
        async with self._db.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM subagent_runs WHERE turn_id = ? "
            "OR (chat_id = ? AND turn_id IS NOT NULL AND created_at >= ?)) "
            "OR EXISTS (SELECT 1 FROM scheduled_tasks WHERE chat_id = ? AND created_at >= ?)",
            (record.turn_id, record.chat_id, since, record.chat_id, since),
        ) as cursor:
            found = await cursor.fetchone()
        return bool(found is not None and found[0])

    async def leftovers(self) -> list[LiveRecord]:
        """Every record left (at start-up: answers a crash or a stop cut short), oldest first."""
        async with self._db.conn.execute("SELECT * FROM live_messages ORDER BY created_at, turn_id") as cursor:
            return [_record(row) for row in await cursor.fetchall()]
