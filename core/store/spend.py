"""What the LLM calls cost, per day, chat and kind of work, and the allowances admins set for chats."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum

from core.store.db import Database


class SpendKind(StrEnum):
    MAIN = "main"  # the main agent's turns
    ANNOUNCE = "announce"  # its turns telling a chat of a finished run (SUBAGENT_RESULT_MODE=announce)
    SUBAGENT = "subagent"  # runs a turn started
    SCHEDULED = "scheduled"  # runs a scheduled task started
    SPEECH = "speech"  # voice notes, audio files and video notes transcribed (bot/senses/transcriber.py)


# The turn id of a run a scheduled task started (bot/schedules/firing.py gives it): no main-agent turn stands
# behind such a run, and its spend is the task's, not a turn's.
SCHEDULED_TURN_PREFIX = "task-"


def run_spend_kind(turn_id: str | None) -> SpendKind:
    """The kind of work a subagent run's LLM calls are: a scheduled task's, or a turn's."""
    scheduled = turn_id is not None and turn_id.startswith(SCHEDULED_TURN_PREFIX)
    return SpendKind.SCHEDULED if scheduled else SpendKind.SUBAGENT


@dataclass(frozen=True, slots=True)
class Spend:
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    estimated_calls: int = 0
    audio_seconds: float = 0.0  # speech to text: the audio transcribed

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class SpendRow:
    day: str
    chat_id: int
    kind: SpendKind
    spend: Spend


class SpendStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(
        self,
        day: str,
        chat_id: int,
        kind: SpendKind,
        input_tokens: int,
        output_tokens: int,
        *,
        estimated: bool,
        audio_seconds: float = 0.0,
    ) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "INSERT INTO llm_spend (day, chat_id, kind, input_tokens, output_tokens, calls, estimated_calls, "
                "audio_seconds) VALUES (?, ?, ?, ?, ?, 1, ?, ?) ON CONFLICT (day, chat_id, kind) DO UPDATE SET "
                "input_tokens = input_tokens + excluded.input_tokens, "
                "output_tokens = output_tokens + excluded.output_tokens, calls = calls + 1, "
                "estimated_calls = estimated_calls + excluded.estimated_calls, "
                "audio_seconds = audio_seconds + excluded.audio_seconds",
                (
                    day,
                    chat_id,
                    kind.value,
                    max(0, input_tokens),
                    max(0, output_tokens),
                    int(estimated),
                    max(0.0, audio_seconds),
                ),
            )

    async def day_by_chat(self, day: str) -> dict[int, int]:
        """Each chat's tokens that day, every kind together."""
        async with self._db.conn.execute(
            "SELECT chat_id, SUM(input_tokens + output_tokens) FROM llm_spend WHERE day = ? GROUP BY chat_id", (day,)
        ) as cursor:
            return {int(row[0]): int(row[1]) for row in await cursor.fetchall()}

    async def rows(self, since_day: str, chat_id: int | None = None) -> list[SpendRow]:
        """Every (day, chat, kind) since a day (inclusive), oldest first: for stats."""
        query = "SELECT * FROM llm_spend WHERE day >= ?"
        params: tuple[object, ...] = (since_day,)
        if chat_id is not None:
            query, params = f"{query} AND chat_id = ?", (since_day, chat_id)
        async with self._db.conn.execute(f"{query} ORDER BY day, chat_id, kind", params) as cursor:
            return [
                SpendRow(
                    day=row["day"],
                    chat_id=row["chat_id"],
                    kind=SpendKind(row["kind"]),
                    spend=Spend(
                        row["input_tokens"],
                        row["output_tokens"],
                        row["calls"],
                        row["estimated_calls"],
                        row["audio_seconds"],
                    ),
                )
                for row in await cursor.fetchall()
            ]

    # --- allowances admins set -------------------------------------------------------------------

    async def chat_allowance(self, chat_id: int) -> int | None:
        async with self._db.conn.execute(
            "SELECT allowance FROM chat_allowances WHERE chat_id = ?", (chat_id,)
        ) as cursor:
            row = await cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    async def set_chat_allowance(self, chat_id: int, allowance: int | None, set_by: int | None) -> None:
        async with self._db.write() as conn:
            await conn.execute(
                "INSERT INTO chat_allowances (chat_id, allowance, set_by, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (chat_id) DO UPDATE SET allowance = excluded.allowance, set_by = excluded.set_by, "
                "updated_at = excluded.updated_at",
                (chat_id, allowance, set_by, time.time()),
            )

    async def topup(self, chat_id: int, day: str) -> int:
        async with self._db.conn.execute(
            "SELECT added FROM chat_allowance_topups WHERE chat_id = ? AND day = ?", (chat_id, day)
        ) as cursor:
            row = await cursor.fetchone()
        return 0 if row is None else int(row[0])

    async def add_topup(self, chat_id: int, day: str, tokens: int) -> int:
        """Add to the chat's allowance for that day; what it was given that day in all."""
        async with self._db.write() as conn:
            await conn.execute(
                "INSERT INTO chat_allowance_topups (chat_id, day, added) VALUES (?, ?, ?) "
                "ON CONFLICT (chat_id, day) DO UPDATE SET added = added + excluded.added",
                (chat_id, day, tokens),
            )
        return await self.topup(chat_id, day)

    async def first_notice(self, chat_id: int, day: str) -> bool:
        """Record that the chat is told of its 80 % that day; False when it was told already."""
        async with self._db.write() as conn:
            cursor = await conn.execute(
                "INSERT INTO allowance_notices (chat_id, day) VALUES (?, ?) ON CONFLICT DO NOTHING", (chat_id, day)
            )
        return cursor.rowcount == 1
