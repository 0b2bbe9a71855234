"""Main-agent turns, recorded so a spawn request can be traced to (and cancelled with) its turn."""

from __future__ import annotations

import time
from enum import StrEnum

from core.store.db import Database

MAX_ASKERS = 20  # a turn that answers more triggers than this is an odd one: its newest askers count


class TurnStatus(StrEnum):
    """A main-agent turn's state: running until it completes, fails or is aborted (merge, /stop, restart)."""

    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"


class TurnStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def start(self, turn_id: str, chat_id: int, trigger_message_id: int | None = None) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "INSERT INTO turns (id, chat_id, status, started_at, trigger_message_id) "
                "VALUES (?, ?, 'running', ?, ?)",
                (turn_id, chat_id, time.time(), trigger_message_id),
            )

    async def end(self, turn_id: str, status: TurnStatus) -> bool:
        """Move a running turn to its final status; False if it already ended (first outcome wins)."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE turns SET status = ?, ended_at = ? WHERE id = ? AND status = 'running'",
                (status, time.time(), turn_id),
            )
        return cursor.rowcount == 1

    async def answered_up_to(self, chat_id: int, below: int) -> int | None:
        """The newest triggering message (row id, under `below`) that a completed turn of the chat answered:
        every trigger after it is still unanswered. None when no completed turn answered one."""
        async with self._db.conn.execute(
            "SELECT trigger_message_id FROM turns WHERE chat_id = ? AND status = 'completed' "
            "AND trigger_message_id < ? ORDER BY started_at DESC LIMIT 1",
            (chat_id, below),
        ) as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else None

    async def status(self, turn_id: str) -> TurnStatus | None:
        async with self._db.conn.execute("SELECT status FROM turns WHERE id = ?", (turn_id,)) as cursor:
            row = await cursor.fetchone()
        return TurnStatus(row[0]) if row else None

    async def chat_of(self, turn_id: str) -> int | None:
        """The conversation the turn was of; None for a turn never recorded (a forged button's)."""
        async with self._db.conn.execute("SELECT chat_id FROM turns WHERE id = ?", (turn_id,)) as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else None

    async def close_interrupted(self) -> int:
        """At start-up: turns left `running` by a crash can never finish; they count as aborted."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE turns SET status = 'aborted', ended_at = ? WHERE status = 'running'", (time.time(),)
            )
        return cursor.rowcount

    async def askers(self, turn_id: str, limit: int = MAX_ASKERS) -> list[tuple[int, str]]:
        """Who asked for the turn, newest first, as (user id, name): the senders of the triggering messages it
        answers, its own and those merged into it (after the newest trigger a completed turn of the chat
        answered before it). [] for a turn no member asked for (an announcement, a scheduled task)."""
        async with self._db.conn.execute(
            "SELECT m.sender_id, m.sender_name FROM turns AS t "
            "JOIN messages AS q ON q.id = t.trigger_message_id "
            "JOIN messages AS m ON m.chat_id = q.chat_id AND m.id <= q.id "
            "WHERE t.id = ? AND m.is_trigger = 1 AND m.is_bot = 0 AND m.sender_id IS NOT NULL "
            "AND m.id > COALESCE((SELECT MAX(p.trigger_message_id) FROM turns AS p WHERE p.chat_id = t.chat_id "
            "AND p.status = 'completed' AND p.trigger_message_id < q.id), 0) "
            "ORDER BY m.id DESC LIMIT ?",
            (turn_id, limit),
        ) as cursor:
            rows = await cursor.fetchall()
        names: dict[int, str] = {}
        for row in rows:
            names.setdefault(int(row[0]), str(row[1]))
        return list(names.items())
