"""Daily allowances against real SQLite: reserved before spending, settled to what was used, never exceeded
by more than one call's own tokens however many calls race; the day rolls over in TIMEZONE."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from core.allowances import Allowances, AllowanceSpent, BudgetStatus
from core.settings import Settings, load_settings
from core.store.spend import SpendKind, SpendStore
from core.stores import Stores

CHAT, OTHER = -100, -200
CALL_TOKENS = 1_000


class Clock:
    def __init__(self, when: str, zone: str) -> None:
        self.now = datetime.fromisoformat(when).replace(tzinfo=ZoneInfo(zone)).timestamp()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[Stores]:
    opened = await Stores.open(load_settings(DATA_DIR=str(tmp_path)))
    yield opened
    await opened.db.close()


def allowances(stores: Stores, clock: Clock | None = None, /, **settings: str) -> tuple[Allowances, Settings]:
    config = load_settings(DATA_DIR="unused", **settings)
    made = Allowances(config, SpendStore(stores.db), clock=clock or Clock("2026-11-26T12:00", config.timezone))
    return made, config


async def call(made: Allowances, chat: int, estimate: int, used: int) -> bool:
    """One LLM call as the wrappers make it: reserve, wait a little (the provider), settle."""
    try:
        held = await made.reserve(chat, SpendKind.SUBAGENT, estimate)
    except AllowanceSpent:
        return False
    await asyncio.sleep(random.uniform(0, 0.01))
    await made.settle(held, used // 2, used - used // 2, estimated=False)
    return True


async def test_without_allowances_every_call_is_admitted_and_counted(stores: Stores) -> None:
    made, _ = allowances(stores)
    assert all(await asyncio.gather(*(call(made, CHAT, 500, 400) for _ in range(20))))
    status = await made.status(CHAT)
    assert (status.used, status.allowance, status.bot_allowance) == (20 * 400, 0, 0)
    (row,) = await SpendStore(stores.db).rows("2026-11-26")
    assert (row.kind, row.spend.calls, row.spend.tokens) == (SpendKind.SUBAGENT, 20, 8000)


@pytest.mark.parametrize("setting", ["CHAT_DAILY_TOKENS", "DAILY_TOKENS"])
async def test_fifty_racing_calls_spend_at_most_the_allowance_plus_one_call(stores: Stores, setting: str) -> None:
    made, _ = allowances(stores, None, **{setting: str(10 * CALL_TOKENS)})
    admitted = await asyncio.gather(*(call(made, CHAT, CALL_TOKENS, CALL_TOKENS) for _ in range(50)))
    status = await made.status(CHAT)
    used = status.used
    assert 10 * CALL_TOKENS <= used <= 10 * CALL_TOKENS + CALL_TOKENS  # the rule; measured: no overshoot at all
    assert used == 10 * CALL_TOKENS and sum(admitted) == 10
    assert await made.left_for(CHAT) is not None


async def test_the_call_that_takes_the_last_tokens_is_the_only_one_that_can_overshoot(stores: Stores) -> None:
    made, _ = allowances(stores, CHAT_DAILY_TOKENS="2500")
    assert await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)
    assert await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)
    # 500 left: a call estimated at 1,000 holds 500, uses 1,000; the next one is refused.
    assert await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)
    assert not await call(made, CHAT, 10, 10)
    assert (await made.status(CHAT)).used == 3000  # 500 over: that one call's own tokens, no more


async def test_chats_have_their_own_allowance_and_the_bot_one_for_all(stores: Stores) -> None:
    made, _ = allowances(stores, CHAT_DAILY_TOKENS="2000", DAILY_TOKENS="3000")
    assert await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)
    assert await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)
    assert not await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)  # the chat's
    assert await call(made, OTHER, CALL_TOKENS, CALL_TOKENS)
    with pytest.raises(AllowanceSpent, match="the bot's daily allowance of 3,000 tokens is used up for today"):
        await made.reserve(OTHER, SpendKind.MAIN, 10)


async def test_the_day_rolls_over_at_midnight_in_the_operators_time_zone(stores: Stores) -> None:
    clock = Clock("2026-11-26T23:59", "Europe/Berlin")
    made, _ = allowances(stores, clock, CHAT_DAILY_TOKENS="1000", TIMEZONE="Europe/Berlin")
    assert await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)
    with pytest.raises(AllowanceSpent, match=r"resets at 00:00 \(Europe/Berlin\)"):
        await made.reserve(CHAT, SpendKind.MAIN, 10)
    held = await made.reserve(OTHER, SpendKind.MAIN, 10)  # admitted before midnight, settled after it
    clock.now += 120
    assert await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)  # a new day
    await made.settle(held, 5, 5, estimated=True)
    rows = {(r.day, r.chat_id): r.spend for r in await SpendStore(stores.db).rows("2026-11-26")}
    assert rows[("2026-11-26", OTHER)].estimated_calls == 1  # counted on the day it was admitted
    assert rows[("2026-11-27", CHAT)].tokens == CALL_TOKENS


async def test_a_chat_is_told_once_a_day_at_eighty_percent(stores: Stores) -> None:
    made, _ = allowances(stores, CHAT_DAILY_TOKENS="5000")
    told: list[tuple[int, BudgetStatus]] = []
    made.on_notice(lambda chat, status: told.append((chat, status)))
    for _ in range(3):
        await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)
    assert told == []
    await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)  # 4,000 of 5,000
    await call(made, CHAT, 500, 500)
    assert [(chat, status.used, status.allowance) for chat, status in told] == [(CHAT, 4000, 5000)]


async def test_admins_set_a_chats_allowance_and_top_it_up_for_the_day(stores: Stores) -> None:
    made, _ = allowances(stores, CHAT_DAILY_TOKENS="1000")
    assert await call(made, CHAT, CALL_TOKENS, CALL_TOKENS)
    assert await made.left_for(CHAT) is not None
    status = await made.add(CHAT, 2000)
    assert (status.allowance, status.added, status.used) == (3000, 2000, 1000)
    assert await made.left_for(CHAT) is None
    status = await made.set_allowance(CHAT, 500, set_by=7)
    assert status.allowance == 2500  # its own 500, and today's top-up
    await made.set_allowance(CHAT, None, set_by=7)
    assert (await made.status(CHAT)).allowance == 3000  # back to the setting


class CountingStore(SpendStore):
    """The real store, counting the reads of a chat's own allowance and of its top-ups."""

    reads = 0

    async def chat_allowance(self, chat_id: int) -> int | None:
        self.reads += 1
        return await super().chat_allowance(chat_id)

    async def topup(self, chat_id: int, day: str) -> int:
        self.reads += 1
        return await super().topup(chat_id, day)


async def test_a_chats_allowance_is_read_once_and_kept_current_as_budget_changes_it(stores: Stores) -> None:
    config = load_settings(DATA_DIR="unused", CHAT_DAILY_TOKENS="1000")
    clock = Clock("2026-11-26T12:00", config.timezone)
    store = CountingStore(stores.db)
    made = Allowances(config, store, clock=clock)
    assert await call(made, CHAT, 300, 300)
    reads = store.reads
    assert reads == 2  # the chat's own allowance and today's top-ups, once each
    assert await call(made, CHAT, 300, 300) and await call(made, CHAT, 300, 300)
    assert await made.left_for(CHAT) is None and store.reads == reads  # nothing read again: 900 of 1,000

    assert (await made.add(CHAT, 500)).allowance == 1500  # /budget add applies at once
    assert await call(made, CHAT, 300, 300)  # 1,200 of 1,500
    assert (await made.set_allowance(CHAT, 700, set_by=7)).allowance == 1200  # its own 700 and the 500
    assert await made.left_for(CHAT) is not None
    again, _ = allowances(stores, clock)  # another start reads what was written
    assert (await again.status(CHAT)).allowance == 1200

    clock.now += 86_400  # the next day: the top-up was for yesterday only
    assert (await made.status(CHAT)).allowance == 700
    await made.set_allowance(CHAT, None, set_by=7)
    assert (await made.status(CHAT)).allowance == 1000  # back to the setting


async def test_the_chats_own_allowances_are_remembered_for_their_day_only(stores: Stores) -> None:
    config = load_settings(DATA_DIR="unused", CHAT_DAILY_TOKENS="1000")
    clock = Clock("2026-11-26T12:00", config.timezone)
    store = CountingStore(stores.db)
    made = Allowances(config, store, clock=clock)
    for chat in range(-1, -101, -1):  # a hundred chats have a call today
        assert await call(made, chat, 10, 10)
    await made.set_allowance(-1, 700, set_by=7)
    assert store.reads == 200  # each chat's own allowance and top-ups, once

    clock.now += 86_400  # the next day: each chat's figures are read at its first call, none kept from before
    assert await call(made, -2, 10, 10)
    assert store.reads == 202
    assert (await made.status(-1)).allowance == 700  # what was set stays set (it is stored)
    assert store.reads == 204
