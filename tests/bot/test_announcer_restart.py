"""Announce mode across a restart: a result that waited for its turn is handed over after the restart,
once; one handed over is never handed over again, however often the store tells of the run."""

from __future__ import annotations

import asyncio

from bot.agent.announce import Announcer
from core.store import ChatStore
from core.store.announcements import AnnouncementStore
from core.store.db import Database
from core.store.runs import RunStatus, RunStore

CHAT = -1001
WAIT_SECONDS = 5.0


async def finished_run(runs: RunStore, run_id: str) -> None:
    await runs.create(
        run_id, chat_id=CHAT, turn_id=None, task=run_id, label=run_id, include_context=False, status=RunStatus.QUEUED
    )
    await runs.mark_running(run_id, None)
    await runs.finish(run_id, RunStatus.COMPLETED, result=f"result of {run_id}")


async def told(announcer: Announcer, notified: list[int], count: int) -> None:
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            if len(notified) >= count:
                return
            await asyncio.sleep(0.01)


async def test_a_waiting_result_is_handed_over_after_a_restart_and_only_once(db: Database, chats: ChatStore) -> None:
    await chats.ensure(CHAT, "group", "Demo")
    runs = RunStore(db)
    before: list[int] = []
    first = Announcer(runs, AnnouncementStore(db), before.append)
    runs.watch(first.run_changed)
    await finished_run(runs, "the-report")
    await told(first, before, 1)
    first.run_changed("the-report")  # the store tells of a run more than once
    await asyncio.sleep(0.05)
    assert before == [CHAT]
    await first.close()  # the process dies before the chat's turn took it

    after: list[int] = []
    second = Announcer(RunStore(db), AnnouncementStore(db), after.append)
    await second.restore()
    assert after == [CHAT]
    text = await second.take(CHAT)
    assert text is not None and "result of the-report" in text
    assert await second.take(CHAT) is None

    again: list[int] = []
    third = Announcer(RunStore(db), AnnouncementStore(db), again.append)
    await third.restore()
    third.run_changed("the-report")
    await asyncio.sleep(0.05)
    assert again == [] and await third.take(CHAT) is None
    await second.close()
    await third.close()
