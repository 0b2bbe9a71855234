"""What is kept of each streamed answer once it is settled (LiveReplies' `on_finished`): the metrics
(`crewbot_stream_first_text_seconds`, `crewbot_stream_edits_total`) and a row for `crewbot stats`.

Time to first visible text is counted from the turn's start (its answer opened before the prompt is built),
not from the asking message's arrival: a turn starts as soon as its message is stored (bot/turns/engine.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bot.agent.live_reply import StreamStats
from core.logging import get_logger
from core.store.streamed_answers import StreamedAnswer, StreamedAnswerStore

log = get_logger(__name__)

# (seconds to the first visible text or None, writes, a draft): RunMetrics.count_stream.
CountStream = Callable[[float | None, int, bool], None]


class StreamRecorder:
    def __init__(
        self,
        store: StreamedAnswerStore,
        count: CountStream | None = None,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._count = count
        self._wall_clock = wall_clock
        self._writing: set[asyncio.Task[None]] = set()

    def finished(self, stats: StreamStats) -> None:
        """One answer settled (called only when something was written): counted now, stored in the background."""
        first = stats.first_visible_at
        first_seconds = None if first is None else first - stats.started_at
        if self._count is not None:
            self._count(first_seconds, stats.writes, stats.drafts)
        if first is None or first_seconds is None:
            return
        answer = StreamedAnswer(
            chat_id=stats.chat_id,
            settled_at=self._wall_clock(),
            first_text_seconds=first_seconds,
            writing_seconds=max((stats.ended_at or first) - first, 0.0),
            edits=stats.writes,
            draft=stats.drafts,
        )
        task = asyncio.create_task(self._store_one(answer), name=f"stream-stats-{stats.chat_id}")
        self._writing.add(task)
        task.add_done_callback(self._writing.discard)

    async def _store_one(self, answer: StreamedAnswer) -> None:
        try:
            await self._store.add(answer)
        except Exception as exc:  # statistics only: never a failure of the answer
            log.warning("stream_stats_not_stored", chat_id=answer.chat_id, error=str(exc))

    async def close(self) -> None:
        """Until every settled answer's row is written (before the database closes)."""
        await asyncio.gather(*self._writing, return_exceptions=True)
