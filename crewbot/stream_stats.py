"""`crewbot stats` on streamed answers: how soon their first words were visible (median and p90 over the window)
and how often a chat's growing answer was edited, against what STREAM_EDIT_INTERVAL_SECONDS allows.

Read from the rows crewbot/stream_record.py keeps (one per settled answer); times are from the turn's start.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from core.settings import Settings
from core.store.db import Database
from core.store.streamed_answers import StreamedAnswer, StreamedAnswerStore

SECONDS_PER_MINUTE = 60.0


@dataclass(frozen=True, slots=True)
class StreamUse:
    answers: int = 0
    drafts: int = 0  # of them shown as drafts (private chats)
    first_text_p50_seconds: float | None = None
    first_text_p90_seconds: float | None = None
    edits: int = 0  # writes of the growing texts, the first sends included
    # Per chat while its answer was written: the edits after the first write over the time from the first
    # words to the last write (an answer written in one go adds neither).
    edits_per_minute: float | None = None
    allowed_per_minute: float = 0.0  # one edit per STREAM_EDIT_INTERVAL_SECONDS


def _nearest_rank(ordered: list[float], share: float) -> float:
    return ordered[max(math.ceil(share * len(ordered)), 1) - 1]


def compute_streams(answers: list[StreamedAnswer], interval_seconds: float) -> StreamUse:
    allowed = SECONDS_PER_MINUTE / interval_seconds
    if not answers:
        return StreamUse(allowed_per_minute=allowed)
    firsts = sorted(a.first_text_seconds for a in answers)
    writing = sum(a.writing_seconds for a in answers)
    later_edits = sum(max(a.edits - 1, 0) for a in answers)
    return StreamUse(
        answers=len(answers),
        drafts=sum(1 for a in answers if a.draft),
        first_text_p50_seconds=statistics.median(firsts),
        first_text_p90_seconds=_nearest_rank(firsts, 0.9),
        edits=sum(a.edits for a in answers),
        edits_per_minute=later_edits / writing * SECONDS_PER_MINUTE if writing > 0 else None,
        allowed_per_minute=allowed,
    )


async def gather_streams(settings: Settings, since_seconds: float, chat_id: int | None) -> StreamUse:
    db = await Database.open(settings.db_path)
    try:
        answers = await StreamedAnswerStore(db).since(time.time() - since_seconds, chat_id)
    finally:
        await db.close()
    return compute_streams(answers, settings.stream_edit_interval_seconds)


def render_streams(use: StreamUse) -> list[str]:
    if not use.answers:
        return ["streamed answers: none"]
    drafts = f", {use.drafts} as drafts" if use.drafts else ""
    rate = "—" if use.edits_per_minute is None else f"{use.edits_per_minute:.1f}"
    return [
        f"streamed answers: {use.answers}{drafts}; first text visible: median {use.first_text_p50_seconds:.2f} s, "
        f"p90 {use.first_text_p90_seconds:.2f} s after the turn's start",
        f"streamed edits: {use.edits}; {rate} per minute per chat while written "
        f"(STREAM_EDIT_INTERVAL_SECONDS allows {use.allowed_per_minute:.0f})",
    ]


def streams_json(use: StreamUse) -> dict[str, Any]:
    return asdict(use)
