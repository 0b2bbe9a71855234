"""The status card through the real PTB channel and the fake Bot API: one card per turn, a reply to the
turn's answer, edited as its runs change (never faster than the throttle), ending with the totals, and
recovering from the edit errors Telegram gives (message deleted, not modified, 429); a Cancel button for
each live run, Cancel all while more than one is live (what pressing them does: tests/crewbot/test_card_presses.py)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from bot.channels.inbound import InboundMessage
from bot.channels.telegram import TelegramChannel
from bot.status_card import StatusCards
from core.store import ChatStore
from core.store.db import Database
from core.store.runs import RunStatus, RunStore
from tests.fakes.faults import Fault
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID

pytestmark = pytest.mark.timeout(60)

INTERVAL_SECONDS = 0.3  # the throttle under test, short so the test is quick
WAIT_SECONDS = 10.0  # only so a broken test fails instead of hanging
POLL_SECONDS = 0.02


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_SECONDS):
        while True:  # the fake has no change event for stored messages: look this often
            if check():
                return
            await asyncio.sleep(POLL_SECONDS)


async def _ignore(message: InboundMessage) -> None:
    return None


@dataclass
class Scene:
    tg: FakeTelegram
    channel: TelegramChannel
    runs: RunStore
    cards: StatusCards

    async def answer(self, turn_id: str) -> int:
        """The bot's answer of the turn, as the main agent sends it."""
        message_id = await self.channel.send_part(GROUP_ID, f"Crew: on it ({turn_id})")
        self.cards.answered(turn_id, message_id)
        return message_id

    async def spawn(self, run_id: str, turn_id: str, label: str) -> None:
        await self.runs.create(
            run_id,
            chat_id=GROUP_ID,
            turn_id=turn_id,
            task=label,
            label=label,
            include_context=False,
            status=RunStatus.QUEUED,
        )

    def cards_sent(self) -> list[int]:
        return [m.message_id for m in self.tg.sent_messages(GROUP_ID) if m.plain_text.startswith("Subagents")]

    def text(self, message_id: int) -> str:
        message = self.tg.message(GROUP_ID, message_id)
        assert message is not None
        return str(message["text"])

    async def until_text(self, message_id: int, part: str) -> None:
        await until(lambda: part in self.text(message_id))

    def buttons(self, message_id: int) -> list[tuple[str, str]]:
        return [(b["text"], b["callback_data"]) for b in self.tg.buttons(GROUP_ID, message_id)]


@pytest.fixture
async def scene(db: Database, chats: ChatStore) -> AsyncIterator[Scene]:
    await chats.ensure(GROUP_ID, "group", "Demo")
    runs_store = RunStore(db)
    async with FakeTelegram() as tg:
        tg.add_chat(GROUP_ID, title="Demo")
        channel = TelegramChannel(tg.token, tg.base_url, poll_timeout_seconds=1)
        await channel.start(_ignore)
        cards = StatusCards(channel, runs_store, interval_seconds=INTERVAL_SECONDS)
        runs_store.watch(cards.run_changed)
        try:
            yield Scene(tg, channel, runs_store, cards)
        finally:
            await cards.close()
            await channel.stop()


async def test_one_card_per_turn_edited_as_states_change_and_ending_with_totals(scene: Scene) -> None:
    answer = await scene.answer("turn-1")
    await scene.spawn("run-aaaa01", "turn-1", "report")
    await scene.spawn("run-aaaa02", "turn-1", "scraper")
    await until(lambda: len(scene.cards_sent()) == 1)
    [card] = scene.cards_sent()
    [posted] = [m for m in scene.tg.sent_messages(GROUP_ID) if m.message_id == card]
    assert posted.reply_to_message_id == answer  # a reply to the turn's answer
    await scene.until_text(card, "Total: 0 running, 2 queued")

    await scene.runs.mark_running("run-aaaa01", None)
    await scene.until_text(card, "report: running")
    await scene.runs.record_usage("run-aaaa01", 1000, 234, 1)
    await scene.runs.finish("run-aaaa01", RunStatus.COMPLETED, result="ok")
    await scene.runs.mark_running("run-aaaa02", None)
    await scene.until_text(card, "scraper: running")
    await scene.runs.finish("run-aaaa02", RunStatus.CANCELLED, error="stop")
    await scene.until_text(card, "Done: 1 completed, 1 cancelled; 1,234 tokens")

    assert scene.cards_sent() == [card]  # edited in place, never posted twice
    edits = scene.tg.requests("editMessageText")
    assert edits
    posts = [c for c in scene.tg.requests("sendMessage") if str(c.params.get("text", "")).startswith("Subagents")]
    times = [posts[0].at, *(e.at for e in edits)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= INTERVAL_SECONDS * 0.95  # the throttle: never more often than the interval
    assert "report: completed" in scene.text(card)


async def test_each_turn_gets_its_own_card(scene: Scene) -> None:
    await scene.answer("turn-1")
    await scene.answer("turn-2")
    await scene.spawn("run-bbbb01", "turn-1", "one")
    await scene.spawn("run-bbbb02", "turn-2", "two")
    await until(lambda: len(scene.cards_sent()) == 2)
    first, second = scene.cards_sent()
    assert {"one" in scene.text(first), "one" in scene.text(second)} == {True, False}


async def test_edit_errors_are_recovered_from(scene: Scene) -> None:
    await scene.answer("turn-1")
    await scene.spawn("run-cccc01", "turn-1", "job")
    await until(lambda: len(scene.cards_sent()) == 1)
    [card] = scene.cards_sent()

    # "Not modified" is success: nothing is posted again.
    scene.tg.fail_next("editMessageText", Fault.error(400, "Bad Request: message is not modified"))
    await scene.runs.mark_running("run-cccc01", None)
    await until(lambda: scene.tg.call_count("editMessageText") >= 1)
    assert scene.cards_sent() == [card]

    # A 429: the card waits as long as Telegram says, then edits.
    scene.tg.fail_next("editMessageText", Fault.retry_after(1))
    await scene.runs.record_usage("run-cccc01", 10, 5, 1)
    await scene.spawn("run-cccc02", "turn-1", "second job")
    await scene.until_text(card, "second job: queued")
    assert scene.cards_sent() == [card]

    # Deleted by someone: the next change posts a new card.
    scene.tg.fail_next("editMessageText", Fault.error(400, "Bad Request: message to edit not found"))
    await scene.runs.finish("run-cccc01", RunStatus.COMPLETED, result="ok")
    await scene.runs.finish("run-cccc02", RunStatus.FAILED, error="boom")
    await until(lambda: len(scene.cards_sent()) == 2)
    new_card = scene.cards_sent()[1]
    await scene.until_text(new_card, "Done: 1 completed, 1 failed")


async def test_live_runs_have_cancel_buttons_that_go_with_their_lines(scene: Scene) -> None:
    await scene.answer("turn-1")
    await scene.spawn("run-dddd01", "turn-1", "report")
    await scene.spawn("run-dddd02", "turn-1", "a scraper with a label far too long for a button")
    await until(lambda: len(scene.cards_sent()) == 1)
    [card] = scene.cards_sent()
    [posted] = [m for m in scene.tg.sent_messages(GROUP_ID) if m.message_id == card]
    assert posted.reply_markup is not None  # posted with its buttons
    assert scene.buttons(card) == [
        ("Cancel report", "c:run-dddd01"),
        ("Cancel a scraper with a label far too l…", "c:run-dddd02"),
        ("Cancel all", "a:run-dddd01"),
    ]

    await scene.runs.mark_running("run-dddd02", None)
    await scene.runs.finish("run-dddd01", RunStatus.COMPLETED, result="ok")
    await scene.until_text(card, "report: completed")
    # The ended run's button went with the edit that shows it ended; one live run needs no Cancel all.
    assert scene.buttons(card) == [("Cancel a scraper with a label far too l…", "c:run-dddd02")]

    await scene.runs.finish("run-dddd02", RunStatus.CANCELLED, error="stop")
    await scene.until_text(card, "Done: 1 completed, 1 cancelled")
    assert scene.buttons(card) == []  # the fake refuses callback_data over 64 bytes: every one sent fit
