"""ChatEngine over MAX_CONCURRENT_TURNS: a chat waits for a turn slot (typing shown), its messages meanwhile make
one turn (a member's, when an announcement waits with them), /stop drops them and ends the wait, a merge keeps
its slot, and close ends the wait."""

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


async def other_waits_behind_a_turn(h: Harness, trigger_id: int | None = 3) -> Turn:
    """CHAT's turn takes the one slot and OTHER waits for it (typing shown), for a member's message
    (`trigger_id`) or an announcement (None); CHAT's turn is returned."""
    h.engine.notify(CHAT)
    first = await h.runner.next_started(1)
    h.engine.notify(OTHER, trigger_id, merge=trigger_id is not None)
    await h.sends.wait_for(lambda: OTHER in h.sends.calls)
    return first


async def test_stop_drops_what_waits_for_a_slot_and_ends_the_wait_and_its_typing(one_slot: Harness) -> None:
    h = one_slot
    first = await other_waits_behind_a_turn(h)

    assert h.engine.stop_turn(OTHER, turn_id="a-card-of-another-turn") is None
    assert h.engine.waiting(OTHER)  # a Stop press names a turn: it never drops a waiting chat's messages
    assert h.engine.stop_turn(OTHER) is None  # /stop: nothing ran, what waited is dropped
    assert not h.engine.waiting(OTHER)
    await h.idle(OTHER)  # its wait ended with the stop, typing with it: CHAT's turn still holds the slot
    assert h.runner.active[CHAT] == 1

    h.engine.notify(OTHER, trigger_id=9)  # a new message waits again, and gets its turn
    h.runner.finish(first)
    second = await h.runner.next_started(2)
    assert (second.chat_id, second.trigger_id) == (OTHER, 9)
    h.runner.finish(second)
    await h.idle(OTHER)
    await h.idle(CHAT)
    assert h.typing.holders(OTHER) == 0


async def test_close_while_a_chat_waits_for_a_slot(one_slot: Harness) -> None:
    h = one_slot
    first = await other_waits_behind_a_turn(h)

    await asyncio.wait_for(h.engine.close(), WAIT_SECONDS)

    assert h.runner.cancelled == [first]
    assert h.engine.idle(OTHER) and h.typing.holders(OTHER) == 0
    assert h.runner.started == [first]


async def test_a_merge_keeps_its_slot_the_merged_turn_runs_before_a_waiting_chat(one_slot: Harness) -> None:
    h = one_slot
    first = await other_waits_behind_a_turn(h)

    h.engine.notify(CHAT)  # inside the window: the first turn is aborted, its words kept for the merged one
    merged = await h.runner.next_started(2)

    assert first.aborted and merged.chat_id == CHAT  # not sent behind OTHER with its Stop button dead
    assert h.engine.current_turn(OTHER) is None and h.engine.waiting(OTHER)
    h.runner.finish(merged)
    third = await h.runner.next_started(3)
    assert third.chat_id == OTHER
    h.runner.finish(third)
    await h.idle(OTHER)
    await h.idle(CHAT)


async def test_a_members_message_waiting_with_an_announcement_makes_the_turn_theirs(one_slot: Harness) -> None:
    h = one_slot
    first = await other_waits_behind_a_turn(h, trigger_id=None)  # OTHER waits for an announcement
    h.engine.notify(OTHER, trigger_id=12)  # then a member asks, still waiting

    h.runner.finish(first)
    second = await h.runner.next_started(2)

    assert (second.chat_id, second.trigger_id) == (OTHER, 12)  # streamed, a reply to them, never skipped
    h.runner.finish(second)
    await h.idle(OTHER)
    assert len(h.runner.started) == 2  # the announcement went with it: bot/agent/main_agent.py takes it


async def test_an_announcement_dropped_by_stop_does_not_make_a_later_question_one(one_slot: Harness) -> None:
    h = one_slot
    first = await other_waits_behind_a_turn(h, trigger_id=None)
    h.engine.stop_turn(OTHER)  # drops the waiting announcement
    h.engine.notify(OTHER, trigger_id=15)

    h.runner.finish(first)
    second = await h.runner.next_started(2)

    assert (second.chat_id, second.trigger_id) == (OTHER, 15)
    h.runner.finish(second)
    await h.idle(OTHER)
