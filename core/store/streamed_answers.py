"""Streamed answers as `crewbot stats` reads them: one row per answer shown while it was written
(core/store/migrations/0016_streamed_answers.sql)."""

from __future__ import annotations

from dataclasses import dataclass

from core.store.db import Database


@dataclass(frozen=True, slots=True)
class StreamedAnswer:
    chat_id: int
    settled_at: float  # unix seconds
    first_text_seconds: float  # the turn's start -> its first words visible in the chat
    writing_seconds: float  # first words visible -> the growing text's last write
    edits: int  # writes of the growing text: the first send, each edit or draft (not the final text)
    draft: bool = False  # a private chat's draft rather than a message edited as it grows


class StreamedAnswerStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, answer: StreamedAnswer) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "INSERT INTO streamed_answers (chat_id, settled_at, first_text_seconds, writing_seconds, edits, draft) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    answer.chat_id,
                    answer.settled_at,
                    answer.first_text_seconds,
                    answer.writing_seconds,
                    answer.edits,
                    int(answer.draft),
                ),
            )

    async def since(self, since: float, chat_id: int | None = None) -> list[StreamedAnswer]:
        """The answers settled at or after `since` (unix seconds), of one chat or all, oldest first."""
        where, params = "settled_at >= ?", [since]
        if chat_id is not None:
            where, params = "settled_at >= ? AND chat_id = ?", [since, chat_id]
        async with self._db.conn.execute(
            "SELECT chat_id, settled_at, first_text_seconds, writing_seconds, edits, draft FROM streamed_answers "
            f"WHERE {where} ORDER BY settled_at, id",
            params,
        ) as cursor:
            rows = await cursor.fetchall()
        return [StreamedAnswer(int(r[0]), float(r[1]), float(r[2]), float(r[3]), int(r[4]), bool(r[5])) for r in rows]
