"""TypingIndicator: reference counts per chat, periodic sends while held, nothing after the last release."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from core.typing_indicator import TypingIndicator
from tests.bot.helpers import WAIT_SECONDS, Recorder

INTERVAL = 0.01
CHAT = -5


class RecordingSend(Recorder):
    """The send function; fails on the calls listed in `fail_on` (1-based)."""

    def __init__(self, fail_on: set[int] | None = None) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.fail_on = fail_on or set()

    async def __call__(self, chat_id: int) -> None:
        self.calls.append(chat_id)
        self.changed()
        if len(self.calls) in self.fail_on:
            raise RuntimeError("Telegram said no")

    def count(self, chat_id: int) -> int:
        return self.calls.count(chat_id)


@pytest.fixture
def send() -> RecordingSend:
    return RecordingSend()


@pytest.fixture
async def typing(send: RecordingSend) -> AsyncIterator[TypingIndicator]:
    indicator = TypingIndicator(send, INTERVAL)
    yield indicator
    await indicator.close()


async def test_sends_repeatedly_while_held(typing: TypingIndicator, send: RecordingSend) -> None:
    typing.acquire(CHAT)

    await send.wait_for(lambda: send.count(CHAT) >= 3)

    assert typing.holders(CHAT) == 1
    assert set(send.calls) == {CHAT}


async def test_refcount_across_two_holders(typing: TypingIndicator, send: RecordingSend) -> None:
    typing.acquire(CHAT)
    typing.acquire(CHAT)
    assert typing.holders(CHAT) == 2

    typing.release(CHAT)
    assert typing.holders(CHAT) == 1
    seen = send.count(CHAT)
    await send.wait_for(lambda: send.count(CHAT) >= seen + 2)  # still typing for the remaining holder

    typing.release(CHAT)
    assert typing.holders(CHAT) == 0


async def test_one_loop_per_chat_however_many_holders(send: RecordingSend) -> None:
    typing = TypingIndicator(send, interval_seconds=60)  # long interval: each loop sends exactly once
    try:
        for _ in range(5):
            typing.acquire(CHAT)
        await send.wait_for(lambda: send.count(CHAT) >= 1)
        for _ in range(3):
            await asyncio.sleep(0)

        assert send.count(CHAT) == 1  # one send per interval, not one per holder
        for _ in range(5):
            typing.release(CHAT)
        assert typing.holders(CHAT) == 0
    finally:
        await typing.close()


async def test_no_sends_after_the_last_release(typing: TypingIndicator, send: RecordingSend) -> None:
    typing.acquire(CHAT)
    typing.acquire(CHAT)
    await send.wait_for(lambda: send.count(CHAT) >= 2)
    typing.release(CHAT)
    typing.release(CHAT)
    after_release = send.count(CHAT)

    await asyncio.sleep(INTERVAL * 10)

    assert send.count(CHAT) == after_release
    assert typing.holders(CHAT) == 0


async def test_chats_are_independent(typing: TypingIndicator, send: RecordingSend) -> None:
    typing.acquire(1)
    typing.acquire(2)
    await send.wait_for(lambda: send.count(1) >= 1 and send.count(2) >= 1)

    typing.release(1)
    at_release, other = send.count(1), send.count(2)
    await send.wait_for(lambda: send.count(2) >= other + 2)  # chat 2 keeps typing for two more intervals

    assert send.count(1) == at_release
    assert typing.holders(2) == 1
    typing.release(2)


async def test_wait_idle_returns_after_release(typing: TypingIndicator) -> None:
    typing.acquire(CHAT)
    typing.acquire(CHAT)
    waiter = asyncio.create_task(typing.wait_idle(CHAT))

    typing.release(CHAT)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not waiter.done()

    typing.release(CHAT)
    await asyncio.wait_for(waiter, WAIT_SECONDS)
    assert typing.holders(CHAT) == 0


async def test_wait_idle_survives_a_new_holder_before_it_wakes(typing: TypingIndicator) -> None:
    typing.acquire(CHAT)
    waiter = asyncio.create_task(typing.wait_idle(CHAT))
    await asyncio.sleep(0)

    typing.release(CHAT)
    typing.acquire(CHAT)  # a subagent starts right as the turn ends
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not waiter.done()

    typing.release(CHAT)
    await asyncio.wait_for(waiter, WAIT_SECONDS)


async def test_wait_idle_on_unused_chat_returns_at_once(typing: TypingIndicator) -> None:
    await asyncio.wait_for(typing.wait_idle(12345), WAIT_SECONDS)


async def test_failing_send_does_not_stop_typing() -> None:
    send = RecordingSend(fail_on={1, 2})
    typing = TypingIndicator(send, INTERVAL)
    try:
        typing.acquire(CHAT)

        await send.wait_for(lambda: send.count(CHAT) >= 4)

        assert typing.holders(CHAT) == 1
        typing.release(CHAT)
        assert typing.holders(CHAT) == 0
    finally:
        await typing.close()


async def test_hold_context_releases_on_error(typing: TypingIndicator, send: RecordingSend) -> None:
    with pytest.raises(KeyError):
        async with typing.hold(CHAT):
            assert typing.holders(CHAT) == 1
            await send.wait_for(lambda: send.count(CHAT) >= 1)
            raise KeyError("boom")

    assert typing.holders(CHAT) == 0


async def test_typing_restarts_after_going_idle(typing: TypingIndicator, send: RecordingSend) -> None:
    async with typing.hold(CHAT):
        await send.wait_for(lambda: send.count(CHAT) >= 1)
    first_spell = send.count(CHAT)

    async with typing.hold(CHAT):
        await send.wait_for(lambda: send.count(CHAT) > first_spell)


async def test_close_stops_every_chat(send: RecordingSend) -> None:
    typing = TypingIndicator(send, INTERVAL)
    typing.acquire(1)
    typing.acquire(2)
    await send.wait_for(lambda: send.count(1) >= 1 and send.count(2) >= 1)

    await typing.close()
    after_close = len(send.calls)
    await asyncio.sleep(INTERVAL * 10)

    assert len(send.calls) == after_close
    assert typing.holders(1) == typing.holders(2) == 0
