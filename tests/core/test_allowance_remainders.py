"""Calls whose estimates exceed their use (as real estimates do: size / 3 plus the output cap) racing on an
allowance: only one call at a time may take a remainder, so the day's use stays within the allowance plus
one call however the holds free up. Real SQLite."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import core.allowances
from core.allowances import Allowances, AllowanceSpent
from core.settings import load_settings
from core.store.spend import SpendKind, SpendStore
from core.stores import Stores

CHAT = -100
CALL = 1_000  # what each call uses
ESTIMATE = 1_500  # what each call holds: more than it uses


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[Stores]:
    opened = await Stores.open(load_settings(DATA_DIR=str(tmp_path)))
    yield opened
    await opened.db.close()


def allowances(stores: Stores, **settings: str) -> Allowances:
    return Allowances(load_settings(DATA_DIR="unused", **settings), SpendStore(stores.db))


async def call(made: Allowances, chat: int, *, late: float) -> bool:
    await asyncio.sleep(late)
    try:
        held = await made.reserve(chat, SpendKind.SUBAGENT, ESTIMATE)
    except AllowanceSpent:
        return False
    await asyncio.sleep(random.uniform(0, 0.01))
    await made.settle(held, CALL // 2, CALL // 2, estimated=False)
    return True


@pytest.mark.parametrize("setting", ["CHAT_DAILY_TOKENS", "DAILY_TOKENS"])
async def test_fifty_calls_holding_more_than_they_use_overshoot_by_at_most_one_call(
    stores: Stores, setting: str
) -> None:
    made = allowances(stores, **{setting: str(10 * CALL)})
    chats = [CHAT] * 50 if setting == "CHAT_DAILY_TOKENS" else [CHAT - n for n in range(50)]
    admitted = await asyncio.gather(*(call(made, chat, late=random.uniform(0, 0.05)) for chat in chats))
    used = sum(admitted) * CALL
    assert 10 * CALL <= used <= 11 * CALL, (sum(admitted), used)
    assert (await made.status(CHAT)).bot_used == used


async def test_a_call_that_only_fits_a_remainder_waits_for_the_calls_in_flight(stores: Stores) -> None:
    made = allowances(stores, CHAT_DAILY_TOKENS="2000")
    first = await made.reserve(CHAT, SpendKind.MAIN, 1200)
    second = asyncio.create_task(made.reserve(CHAT, SpendKind.MAIN, 1200))  # 800 left: a remainder
    await asyncio.sleep(0.05)
    assert not second.done()  # it may not take the remainder while the first could still leave room
    await made.settle(first, 300, 200, estimated=False)  # used 500: 1,500 left, the second fits whole
    assert (await second).tokens == 1200
    third = asyncio.create_task(made.reserve(CHAT, SpendKind.MAIN, 1200))  # 300 left, the second in flight
    await asyncio.sleep(0.05)
    assert not third.done()
    await made.settle(await second, 500, 500, estimated=False)  # 500 left, no call in flight: it takes them
    assert (await third).tokens == 500
    with pytest.raises(AllowanceSpent):  # the remainder is held: the next call is refused at once
        await made.reserve(CHAT, SpendKind.MAIN, 10)


async def test_a_remainder_held_too_long_refuses_with_the_reason(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core.allowances, "REMAINDER_WAIT_SECONDS", 0.05)
    made = allowances(stores, DAILY_TOKENS="2000")
    await made.reserve(CHAT, SpendKind.MAIN, 1500)  # in flight, never settled
    with pytest.raises(AllowanceSpent, match="what is left of the daily allowance is held by calls"):
        await made.reserve(CHAT - 1, SpendKind.MAIN, 1000)
    assert (await made.reserve(CHAT - 1, SpendKind.MAIN, 400)).tokens == 400  # a call that fits is let in
