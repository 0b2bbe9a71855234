"""The cards' throttle holds only the chats edited within its interval, not every chat that ever had a card."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from bot.channels.buttons import CardButton
from bot.status_card import StatusCards
from core.store import ChatStore
from core.store.db import Database
from core.store.runs import RunStatus, RunStore

pytestmark = pytest.mark.timeout(30)

INTERVAL_SECONDS = 5.0
CHATS = 50
WAIT_SECONDS = 10.0


class Clock:
    now = 1_000.0

    def __call__(self) -> float:
        return self.now


class PostedCards:
    """The channel's edge: every chat's cards as posted."""

    def __init__(self) -> None:
        self.posted: list[int] = []
        self.changed = asyncio.Event()

    async def post_card(
        self, chat_id: int, text: str, reply_to: int | None, buttons: Sequence[CardButton] = ()
    ) -> int | None:
        self.posted.append(chat_id)
        self.changed.set()
        return len(self.posted)

    async def edit_card(self, chat_id: int, message_id: int, text: str, buttons: Sequence[CardButton] = ()) -> None:
        return None


async def card_in(chats: ChatStore, runs: RunStore, channel: PostedCards, chat_id: int) -> None:
    """A turn of the chat spawns a run: its card is posted."""
    await chats.ensure(chat_id, "group", f"chat {chat_id}")
    await runs.create(
        f"run-{-chat_id:06d}",
        chat_id=chat_id,
        turn_id=f"turn-{-chat_id}",
        task="t",
        label="t",
        include_context=False,
        status=RunStatus.QUEUED,
    )
    async with asyncio.timeout(WAIT_SECONDS):
        while chat_id not in channel.posted:
            channel.changed.clear()
            await channel.changed.wait()


async def test_a_chat_is_forgotten_by_the_throttle_once_its_interval_has_passed(db: Database, chats: ChatStore) -> None:
    clock, channel, runs = Clock(), PostedCards(), RunStore(db)
    cards = StatusCards(channel, runs, interval_seconds=INTERVAL_SECONDS, answer_wait_seconds=0, clock=clock)
    runs.watch(cards.run_changed)
    try:
        for chat_id in range(-1, -CHATS - 1, -1):
            cards.answered(f"turn-{-chat_id}", None)
            await card_in(chats, runs, channel, chat_id)
        assert len(cards._last_edit) == CHATS  # all within the interval: each chat's next edit must wait

        clock.now += INTERVAL_SECONDS
        cards.answered("turn-999", None)
        await card_in(chats, runs, channel, -999)
        assert list(cards._last_edit) == [-999]  # the others would wait for nothing: not held any longer
    finally:
        await cards.close()
