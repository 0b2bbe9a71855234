"""The console shows the status card too: printed when the turn's first run appears and at each change, with
its buttons' actions as the commands that do the same."""

from __future__ import annotations

import asyncio
import io

import pytest

from bot.channels.console import ConsoleChannel
from bot.status_card import StatusCards
from core.store import ChatStore
from core.store.db import Database
from core.store.runs import RunStatus, RunStore

pytestmark = pytest.mark.timeout(30)

CHAT = 1
WAIT_SECONDS = 10.0


async def until_printed(out: io.StringIO, text: str) -> None:
    async with asyncio.timeout(WAIT_SECONDS):
        while True:  # the console has no change event: look again shortly
            if text in out.getvalue():
                return
            await asyncio.sleep(0.02)


async def test_the_console_prints_the_card_at_each_change(db: Database, chats: ChatStore) -> None:
    await chats.ensure(CHAT, "console", "console")
    out = io.StringIO()
    channel = ConsoleChannel("Crew", user_name="me", stdin=io.StringIO(), stdout=out)
    runs = RunStore(db)
    cards = StatusCards(channel, runs, interval_seconds=0.05)
    runs.watch(cards.run_changed)
    try:
        cards.answered("turn-1", None)  # the console's answer has no message id to reply to
        await runs.create(
            "run-000001",
            chat_id=CHAT,
            turn_id="turn-1",
            task="t",
            label="tidy",
            include_context=False,
            status=RunStatus.QUEUED,
        )
        await until_printed(out, "tidy: queued")
        assert "/cancel run-000001 – Cancel tidy" in out.getvalue()
        await runs.create(
            "run-000002",
            chat_id=CHAT,
            turn_id="turn-1",
            task="t",
            label="sweep",
            include_context=False,
            status=RunStatus.QUEUED,
        )
        await until_printed(out, "/cancel all – cancel every run of this chat")
        await runs.finish("run-000002", RunStatus.CANCELLED, error="no")
        await runs.mark_running("run-000001", None)
        await until_printed(out, "tidy: running")
        await runs.finish("run-000001", RunStatus.COMPLETED, result="ok")
        await until_printed(out, "Done: 1 completed")
        final = out.getvalue().rsplit("Subagents of this request:", 1)[1]
        assert "/cancel" not in final  # nothing left to cancel: no commands under the final card
    finally:
        await cards.close()
