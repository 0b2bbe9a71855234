"""ChatEngine over MAX_CONCURRENT_TURNS: a chat waits for a turn slot (typing shown), its messages meanwhile make
one turn, /stop drops them, and close ends the wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bot.turns.engine import ChatEngine, Turn
from tests.bot.engine_harness import CHAT, MERGE_WINDOW, OTHER, Harness
from tests.bot.helpers import WAIT_SECONDS


@pytest.fixture
async def one_slot(h: Harness) -> AsyncIterator[Harness]:
    """The harness with MAX_CONCURRENT_TURNS=1: a second chat's turn waits for the first's to end."""
    engine = ChatEngine(h.runner, h.lifecycle, h.typing, MERGE_WINDOW, clock=h.clock, max_concurrent_turns=1)
    yield Harness(engine, h.runner, h.lifecycle, h.typing, h.sends, h.clock)
    await engine.close()


async def test_over_the_bound_a_chat_waits_typing_and_its_messages_meanwhile_make_one_turn(one_slot: Harness) -> None:
    h = one_slot
    h.engine.notify(CHAT, trigger_id=1)
    first = await h.runner.next_started(1)
    h.engine.notify(OTHER, trigger_id=5)
    h.engine.notify(OTHER, trigger_id=7)  # no turn of OTHER's yet: nothing to abort, both wait together

    await h.sends.wait_for(lambda: h.sends.calls.count(OTHER) >= 2)  # typing shown while it waits
    assert h.engine.current_turn(OTHER) is None and h.engine.waiting(OTHER)
    assert h.runner.started == [first]
    assert h.engine.turn_counts() == (1, 1)  # one running, one chat waiting: the metrics' gauges

    h.runner.finish(first)
    second = await h.runner.next_started(2)
    assert (second.chat_id, second.trigger_id) == (OTHER, 7)  # one turn, whose prompt ends at the newest
    h.runner.finish(second)
    await h.idle(OTHER)
    await h.idle(CHAT)
    assert len(h.runner.started) == 2
    assert h.lifecycle.events == [
        ("started", first.id),
        ("ended:completed", first.id),
        ("started", second.id),
        ("ended:completed", second.id),
    ]  # never two turns at once
    assert h.lifecycle.aborted == []


async def other_waits_behind_a_turn(h: Harness) -> Turn:
    """CHAT's turn takes the one slot and OTHER waits for it (typing shown); CHAT's turn is returned."""
    h.engine.notify(CHAT)
    first = await h.runner.next_started(1)
    h.engine.notify(OTHER)
    await h.sends.wait_for(lambda: OTHER in h.sends.calls)
    return first


async def test_stop_drops_what_waits_for_a_slot_and_the_chat_never_gets_a_turn(one_slot: Harness) -> None:
    h = one_slot
    first = await other_waits_behind_a_turn(h)

    assert h.engine.stop_turn(OTHER, turn_id="a-card-of-another-turn") is None
    assert h.engine.waiting(OTHER)  # a Stop press names a turn: it never drops a waiting chat's messages
    assert h.engine.stop_turn(OTHER) is None  # /stop: nothing ran, what waited is dropped
    assert not h.engine.waiting(OTHER)

    h.runner.finish(first)
    await h.idle(OTHER)
    await h.idle(CHAT)
    assert h.runner.started == [first]
    assert h.typing.holders(OTHER) == 0


async def test_close_while_a_chat_waits_for_a_slot(one_slot: Harness) -> None:
    h = one_slot
    first = await other_waits_behind_a_turn(h)

    await asyncio.wait_for(h.engine.close(), WAIT_SECONDS)

    assert h.runner.cancelled == [first]
    assert h.engine.idle(OTHER) and h.typing.holders(OTHER) == 0
    assert h.runner.started == [first]
