"""The edit pacer on a virtual clock: one chat's interval, 20 chats streaming at once within the budget, and a
chat slowed by its 429s (doubled, remembered, halving back over minutes)."""

from __future__ import annotations

import asyncio
import itertools

from bot.channels.edit_pacer import MAX_SLOWED_INTERVAL_SECONDS, SLOWDOWN_HALVING_SECONDS, EditPacer


class VirtualClock:
    """Time that moves only when someone sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)


async def test_one_chat_writes_at_most_once_per_interval() -> None:
    clock = VirtualClock()
    pacer = EditPacer(1.5, 20.0, clock=clock, sleep=clock.sleep)
    pacer.open(1)
    times = []
    for _ in range(5):
        await pacer.wait_turn(1)
        times.append(clock.now)
    assert [round(b - a, 6) for a, b in itertools.pairwise(times)] == [1.5] * 4


async def test_twenty_chats_stay_within_the_global_budget_and_each_its_interval() -> None:
    clock = VirtualClock()
    pacer = EditPacer(0.5, 10.0, clock=clock, sleep=clock.sleep)
    chats = range(20)
    for chat in chats:
        pacer.open(chat)
    assert pacer.interval_seconds() == 2.0  # 20 chats at 10 a second: each one every 2 s, not every 0.5 s
    writes: list[tuple[float, int]] = []
    for _ in range(3):
        for chat in chats:
            await pacer.wait_turn(chat)
            writes.append((clock.now, chat))
    moments = sorted(at for at, _ in writes)
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(moments))  # 10 a second at most
    for chat in chats:
        own = [at for at, c in writes if c == chat]
        assert all(b - a >= 2.0 - 1e-9 for a, b in itertools.pairwise(own))


async def test_a_429_holds_the_chat_back_for_its_retry_after() -> None:
    clock = VirtualClock()
    pacer = EditPacer(0.5, 20.0, clock=clock, sleep=clock.sleep)
    pacer.open(7)
    await pacer.wait_turn(7)
    pacer.back_off(7, 10.0)
    await pacer.wait_turn(7)
    assert clock.now >= 10.0


async def test_each_429_doubles_the_chats_interval_up_to_the_cap_and_it_halves_back_over_minutes() -> None:
    clock = VirtualClock()
    pacer = EditPacer(3.0, 20.0, clock=clock, sleep=clock.sleep)
    pacer.open(7)
    pacer.open(8)
    await pacer.wait_turn(7)
    pacer.back_off(7, 1.0)
    assert pacer.chat_interval_seconds(7) == 6.0
    assert pacer.chat_interval_seconds(8) == 3.0  # another chat keeps its pace
    before = clock.now
    await pacer.wait_turn(7)
    written = clock.now
    await pacer.wait_turn(7)
    assert written - before >= 1.0 and clock.now - written == 6.0  # the retry_after, then the slower pace
    for _ in range(4):
        pacer.back_off(7, 1.0)
    assert pacer.chat_interval_seconds(7) == MAX_SLOWED_INTERVAL_SECONDS  # 48 s capped
    pacer.close(7)
    clock.now += SLOWDOWN_HALVING_SECONDS - 1
    pacer.open(7)
    assert pacer.chat_interval_seconds(7) == MAX_SLOWED_INTERVAL_SECONDS  # remembered across its answers
    halvings = []
    for _ in range(4):
        clock.now += SLOWDOWN_HALVING_SECONDS
        halvings.append(pacer.chat_interval_seconds(7))
    assert halvings == [15.0, 7.5, 3.75, 3.0]  # back to its own pace, not below it


async def test_a_private_chats_draft_has_its_own_interval() -> None:
    clock = VirtualClock()

    async def drafts_for(chat_id: int) -> bool:
        return chat_id > 0

    pacer = EditPacer(3.0, 20.0, draft_interval_seconds=1.0, drafts_for=drafts_for, clock=clock, sleep=clock.sleep)
    for chat in (5, -5):
        pacer.open(chat)
        times = []
        for _ in range(3):
            await pacer.wait_turn(chat)
            times.append(clock.now)
        expected = 1.0 if chat > 0 else 3.0  # the draft's interval, the group's
        assert [round(b - a, 6) for a, b in itertools.pairwise(times)] == [expected] * 2


async def test_chats_whose_wait_is_over_are_forgotten() -> None:
    clock = VirtualClock()
    pacer = EditPacer(3.0, 20.0, clock=clock, sleep=clock.sleep)
    for chat in range(500):  # each streamed once, its last write answered 429
        pacer.open(chat)
        await pacer.wait_turn(chat)
        pacer.back_off(chat, 5.0)
        pacer.close(chat)
    assert pacer.remembered() == 500  # their waits and slowdowns are still on
    clock.now += 10 * SLOWDOWN_HALVING_SECONDS
    pacer.open(1000)
    assert pacer.remembered() == 1  # only the chat streaming now
