"""The words of voice notes, audio files and video notes, transcribed once when they arrived (bot/senses/), or why
they were not: one row per chat file. The prompt quotes them as the member's words."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from core.store.db import Database

MAX_TRANSCRIPT_CHARS = 20_000  # what is kept of one transcript (5 minutes of fast speech is about 5,000)
MAX_REASON_CHARS = 300
INTERRUPTED_REASON = "the bot stopped while it was being transcribed"


class TranscriptState(StrEnum):
    PENDING = "pending"  # sent to the speech-to-text service, no answer yet
    DONE = "done"
    FAILED = "failed"  # `reason` says why (over the limit, not audio, the service failed)


@dataclass(frozen=True, slots=True)
class Transcript:
    chat_file_id: int
    chat_id: int
    state: TranscriptState
    text: str
    reason: str | None
    audio_seconds: float | None


class TranscriptStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def begin(self, chat_file_id: int, chat_id: int) -> bool:
        """Record that the file is being transcribed; False when it has a row already (never done twice)."""
        now = time.time()
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "INSERT INTO transcripts (chat_file_id, chat_id, state, created_at, updated_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (chat_file_id, chat_id, TranscriptState.PENDING.value, now, now),
            )
        return cursor.rowcount == 1

    async def done(self, chat_file_id: int, text: str, audio_seconds: float | None) -> None:
        await self._finish(chat_file_id, TranscriptState.DONE, text[:MAX_TRANSCRIPT_CHARS], None, audio_seconds)

    async def failed(self, chat_file_id: int, reason: str, audio_seconds: float | None = None) -> None:
        line = " ".join(reason.split())[:MAX_REASON_CHARS]
        await self._finish(chat_file_id, TranscriptState.FAILED, "", line, audio_seconds)

    async def _finish(
        self, chat_file_id: int, state: TranscriptState, text: str, reason: str | None, seconds: float | None
    ) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "UPDATE transcripts SET state = ?, text = ?, reason = ?, audio_seconds = ?, updated_at = ? "
                "WHERE chat_file_id = ?",
                (state.value, text, reason, seconds, time.time(), chat_file_id),
            )

    async def of_files(self, chat_file_ids: Iterable[int]) -> dict[int, Transcript]:
        ids = list(dict.fromkeys(chat_file_ids))
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        async with self._db.conn.execute(f"SELECT * FROM transcripts WHERE chat_file_id IN ({marks})", ids) as cursor:
            rows = await cursor.fetchall()
        return {
            row["chat_file_id"]: Transcript(
                chat_file_id=row["chat_file_id"],
                chat_id=row["chat_id"],
                state=TranscriptState(row["state"]),
                text=row["text"],
                reason=row["reason"],
                audio_seconds=row["audio_seconds"],
            )
            for row in rows
        }

    async def close_interrupted(self) -> int:
        """At start: a transcription a stop or crash cut short is not retried (its audio may be what broke it)."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "UPDATE transcripts SET state = ?, reason = ?, updated_at = ? WHERE state = ?",
                (TranscriptState.FAILED.value, INTERRUPTED_REASON, time.time(), TranscriptState.PENDING.value),
            )
        return cursor.rowcount
