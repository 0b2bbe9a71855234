"""Announce mode's memory: finished runs whose results the main agent has not been handed yet."""

from __future__ import annotations

from collections.abc import Iterable

from core.store.db import Database
from core.store.runs import RunRecord, run_from_row

WAITING = 1  # announce_pending: the result waits for a main-agent turn
HANDED_OVER = 2  # a turn took it


class AnnouncementStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, run_id: str) -> bool:
        """Mark the run's result as waiting; False if it already waited or was handed over."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                f"UPDATE subagent_runs SET announce_pending = {WAITING} WHERE id = ? AND announce_pending = 0",
                (run_id,),
            )
        return cursor.rowcount == 1

    async def done(self, run_ids: Iterable[str]) -> None:
        async with self._db.write() as conn:
            await conn.executemany(
                f"UPDATE subagent_runs SET announce_pending = {HANDED_OVER} WHERE id = ?",
                [(run_id,) for run_id in run_ids],
            )

    async def pending(self) -> list[RunRecord]:
        """Oldest first, all chats."""
        async with self._db.conn.execute(
            f"SELECT * FROM subagent_runs WHERE announce_pending = {WAITING} ORDER BY finished_at, rowid"
        ) as cursor:
            return [run_from_row(row) for row in await cursor.fetchall()]
