"""Streamed answers as crewbot stats reads them: stored once each, read back by time and by chat, oldest first."""

from __future__ import annotations

from pathlib import Path

from core.store.db import Database
from core.store.streamed_answers import StreamedAnswer, StreamedAnswerStore

CHAT, OTHER = -100, -200


async def test_answers_are_read_back_since_a_time_and_of_one_chat(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "crewbot.db")
    try:
        store = StreamedAnswerStore(db)
        old = StreamedAnswer(CHAT, 100.0, 0.5, 10.0, 8)
        newer = StreamedAnswer(OTHER, 300.0, 1.5, 0.0, 1, draft=True)
        new = StreamedAnswer(CHAT, 200.0, 0.75, 4.5, 4)
        for answer in (old, newer, new):
            await store.add(answer)
        assert await store.since(0.0) == [old, new, newer]
        assert await store.since(150.0) == [new, newer]
        assert await store.since(0.0, CHAT) == [old, new]
        assert await store.since(250.0, CHAT) == []
    finally:
        await db.close()
