"""Status cards and scheduled tasks: every fire of a task shares its turn id, so its runs get no card
(one would list every past run of the task)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from bot.channels.buttons import CardButton
from bot.schedules.firing import TASK_TURN_PREFIX
from bot.status_card import StatusCards
from core.store import ChatStore
from core.store.db import Database
from core.store.runs import RunStatus, RunStore

pytestmark = pytest.mark.timeout(30)
CHAT = -1001


class Cards:
    def __init__(self) -> None:
        self.posted: list[str] = []
        self.shown: dict[int, str] = {}

    async def post_card(self, chat_id: int, text: str, reply_to: int | None, buttons: Sequence[CardButton] = ()) -> int:
        self.posted.append(text)
        self.shown[len(self.posted)] = text
        return len(self.posted)

    async def edit_card(self, chat_id: int, message_id: int, text: str, buttons: Sequence[CardButton] = ()) -> None:
        self.shown[message_id] = text


async def fire(runs: RunStore, run_id: str, turn_id: str) -> None:
    await runs.create(
        run_id,
        chat_id=CHAT,
        turn_id=turn_id,
        task=run_id,
        label=run_id,
        include_context=False,
        status=RunStatus.QUEUED,
    )
    await runs.mark_running(run_id, None)
    await runs.finish(run_id, RunStatus.COMPLETED, result="ok")


async def test_a_scheduled_tasks_runs_get_no_card_while_a_turns_run_does(db: Database, chats: ChatStore) -> None:
    await chats.ensure(CHAT, "group", "Demo")
    runs = RunStore(db)
    channel = Cards()
    cards = StatusCards(channel, runs, interval_seconds=0.01, answer_wait_seconds=0.05)
    runs.watch(cards.run_changed)
    scheduled = TASK_TURN_PREFIX + "abcd1234"  # what TaskFiring passes for every fire of the task
    try:
        await fire(runs, "monday-run", scheduled)
        await fire(runs, "tuesday-run", scheduled)
        await fire(runs, "asked-run", "turn-1")  # after them: once its card is done, theirs had their chance
        async with asyncio.timeout(10):
            while True:
                if any("Done" in text for text in channel.shown.values()):
                    break
                await asyncio.sleep(0.02)
    finally:
        await cards.close()
    assert len(channel.posted) == 1 and "asked-run" in channel.posted[0]
    assert not any("monday-run" in text or "tuesday-run" in text for text in channel.shown.values())
