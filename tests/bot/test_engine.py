"""ChatEngine: one turn per chat, chats in parallel, abort-and-merge inside the window, /stop, typing, close."""

from __future__ import annotations

import asyncio

import pytest

from bot.turns.engine import ChatEngine, Turn
from core.typing_indicator import TypingIndicator
from tests.bot.engine_harness import CHAT, MERGE_WINDOW, OTHER, FakeClock, Harness, TypingSends
from tests.bot.helpers import WAIT_SECONDS, ControlledRunner, RecordingLifecycle


async def test_a_turn_runs_and_completes(h: Harness) -> None:
    h.engine.notify(CHAT)
    turn = await h.runner.next_started(1)

    assert turn.chat_id == CHAT
    assert h.engine.current_turn(CHAT) is turn
    assert not h.engine.idle(CHAT)
    h.runner.finish(turn)
    await h.idle(CHAT)

    assert h.lifecycle.started == [turn]
    assert h.lifecycle.ended == [(turn, "completed")]
    assert h.lifecycle.aborted == []
    assert h.engine.current_turn(CHAT) is None


async def test_one_turn_at_a_time_per_chat_in_order(h: Harness) -> None:
    h.engine.notify(CHAT)
    first = await h.runner.next_started(1)
    h.clock.now += MERGE_WINDOW + 1  # past the window: the message waits for the next turn

    h.engine.notify(CHAT)
    h.engine.notify(CHAT)  # more messages while waiting are answered together by one turn
    await asyncio.sleep(0)
    assert len(h.runner.started) == 1
    assert not first.aborted

    h.runner.finish(first)
    second = await h.runner.next_started(2)
    h.runner.finish(second)
    await h.idle(CHAT)

    assert len(h.runner.started) == 2
    assert h.runner.max_active[CHAT] == 1
    assert h.runner.cancelled == []
    assert h.lifecycle.events == [
        ("started", first.id),
        ("ended:completed", first.id),
        ("started", second.id),
        ("ended:completed", second.id),
    ]


async def test_two_chats_run_concurrently(h: Harness) -> None:
    h.engine.notify(CHAT)
    h.engine.notify(OTHER)

    await h.runner.wait_for(lambda: len(h.runner.started) == 2)

    assert {t.chat_id for t in h.runner.started} == {CHAT, OTHER}
    assert h.runner.active == {CHAT: 1, OTHER: 1}  # both in flight at once
    assert h.engine.active_chats() == 2
    for turn in list(h.runner.started):
        h.runner.finish(turn)
    await h.idle(CHAT)
    await h.idle(OTHER)
    assert {status for _, status in h.lifecycle.ended} == {"completed"}
    assert h.engine.active_chats() == 0  # nothing kept for chats without a turn


async def test_a_trigger_arriving_during_a_turn_gets_its_own_turn_and_the_first_never_sees_it(h: Harness) -> None:
    # The first turn's prompt ends at the trigger it was started for: the later trigger is answered by
    # the next turn alone (it used to be answered twice when it landed in the store mid-turn).
    h.engine.notify(CHAT, 5)
    first = await h.runner.next_started(1)
    h.clock.now += MERGE_WINDOW + 1
    h.engine.notify(CHAT, 9)
    h.engine.notify(CHAT, 7)  # a slower update of an older message never moves the bound back
    h.runner.finish(first)
    second = await h.runner.next_started(2)
    h.runner.finish(second)
    await h.idle(CHAT)
    assert (first.trigger_id, second.trigger_id) == (5, 9)


async def test_a_chat_state_dropped_after_its_turn_comes_back_on_the_next_message(h: Harness) -> None:
    h.engine.notify(CHAT)
    h.runner.finish(await h.runner.next_started(1))
    await h.idle(CHAT)
    assert h.engine.active_chats() == 0

    h.engine.notify(CHAT)
    second = await h.runner.next_started(2)
    assert h.engine.current_turn(CHAT) is second
    h.runner.finish(second)
    await h.idle(CHAT)
    assert [status for _, status in h.lifecycle.ended] == ["completed", "completed"]


async def test_notify_inside_the_window_aborts_and_starts_a_merged_turn(h: Harness) -> None:
    h.engine.notify(CHAT)
    first = await h.runner.next_started(1)
    h.clock.now += MERGE_WINDOW / 2

    h.engine.notify(CHAT)

    second = await h.runner.next_started(2)
    assert first.aborted
    assert h.runner.cancelled == [first]  # its task saw CancelledError
    await h.lifecycle.wait_for(lambda: len(h.lifecycle.aborted) == 1)
    assert h.lifecycle.aborted == [(first, "merge")]
    assert (first, "aborted") in h.lifecycle.ended
    assert second is not first and not second.aborted

    h.runner.finish(second)
    await h.idle(CHAT)
    assert h.lifecycle.ended == [(first, "aborted"), (second, "completed")]
    assert h.runner.completed == [second]


async def test_the_merged_turn_starts_once_the_aborted_turns_subagents_are_stopped(h: Harness) -> None:
    # Its prompt then sees them cancelled, and it leaves the host's CPU to the engine's kills meanwhile.
    h.lifecycle.abort_gate = asyncio.Event()
    h.engine.notify(CHAT)
    first = await h.runner.next_started(1)
    h.engine.notify(CHAT)
    await h.lifecycle.wait_for(lambda: ("ended:aborted", first.id) in h.lifecycle.events)
    await asyncio.sleep(0.1)  # long enough for a second turn that did not wait to have started
    h.lifecycle.abort_gate.set()
    second = await h.runner.next_started(2)
    events = h.lifecycle.events
    assert events.index(("cascade_done", first.id)) < events.index(("started", second.id))
    h.runner.finish(second)
    await h.idle(CHAT)


async def test_a_cascade_that_hangs_delays_the_merged_turn_by_its_bound_only(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bot.turns.engine.CASCADE_WAIT_SECONDS", 0.05)
    h.lifecycle.abort_gate = asyncio.Event()  # never set: the engine is away, its kills go unanswered
    h.engine.notify(CHAT)
    await h.runner.next_started(1)
    h.engine.notify(CHAT)
    second = await h.runner.next_started(2)
    h.runner.finish(second)
    await h.idle(CHAT)
    assert [status for _, status in h.lifecycle.ended] == ["aborted", "completed"]
    h.lifecycle.abort_gate.set()


async def test_notify_after_the_window_does_not_abort(h: Harness) -> None:
    h.engine.notify(CHAT)
    first = await h.runner.next_started(1)
    h.clock.now += MERGE_WINDOW  # exactly at the window's end counts as outside it

    h.engine.notify(CHAT)
    await asyncio.sleep(0)

    assert not first.aborted
    assert h.runner.cancelled == []
    h.runner.finish(first)
    second = await h.runner.next_started(2)
    h.runner.finish(second)
    await h.idle(CHAT)
    assert h.runner.completed == [first, second]
    assert h.lifecycle.aborted == []


async def test_a_delivering_turn_is_not_aborted_by_a_merge(h: Harness) -> None:
    h.engine.notify(CHAT)
    first = await h.runner.next_started(1)
    first.begin_delivery()

    h.engine.notify(CHAT)  # inside the window, but the reply is already going out
    await asyncio.sleep(0)

    assert not first.aborted
    assert h.runner.cancelled == []
    h.runner.finish(first)
    second = await h.runner.next_started(2)
    h.runner.finish(second)
    await h.idle(CHAT)
    assert h.lifecycle.ended == [(first, "completed"), (second, "completed")]


async def test_merge_window_zero_never_aborts() -> None:
    runner, lifecycle = ControlledRunner(), RecordingLifecycle()
    typing = TypingIndicator(TypingSends(), interval_seconds=0.01)
    engine = ChatEngine(runner, lifecycle, typing, merge_window_seconds=0, clock=FakeClock())
    try:
        engine.notify(CHAT)
        first = await runner.next_started(1)
        engine.notify(CHAT)
        await asyncio.sleep(0)
        assert not first.aborted
        runner.finish(first)
        runner.finish(await runner.next_started(2))
        await asyncio.wait_for(typing.wait_idle(CHAT), WAIT_SECONDS)
        assert runner.cancelled == []
    finally:
        await engine.close()
        await typing.close()


async def test_stop_turn_aborts_and_drops_waiting_messages(h: Harness) -> None:
    h.engine.notify(CHAT)
    turn = await h.runner.next_started(1)
    h.clock.now += 60
    h.engine.notify(CHAT)  # waiting for the next turn

    stopped = h.engine.stop_turn(CHAT)

    assert stopped is turn
    assert turn.aborted
    await h.idle(CHAT)
    await h.lifecycle.wait_for(lambda: len(h.lifecycle.aborted) == 1)
    assert h.runner.cancelled == [turn]
    assert h.lifecycle.aborted == [(turn, "stop")]
    assert h.lifecycle.ended == [(turn, "aborted")]
    assert len(h.runner.started) == 1  # the waiting message was dropped with the stop


async def test_stop_turn_with_nothing_running(h: Harness) -> None:
    assert h.engine.stop_turn(CHAT) is None

    h.engine.notify(CHAT)
    turn = await h.runner.next_started(1)
    assert h.engine.stop_turn(CHAT) is turn
    assert h.engine.stop_turn(CHAT) is None  # already stopping


async def test_a_failing_turn_is_recorded_and_the_chat_goes_on(h: Harness) -> None:
    calls: list[Turn] = []

    async def failing(turn: Turn) -> None:
        calls.append(turn)
        if len(calls) == 1:
            raise RuntimeError("model exploded")

    engine = ChatEngine(failing, h.lifecycle, h.typing, MERGE_WINDOW, clock=h.clock)
    try:
        engine.notify(CHAT)
        await h.lifecycle.wait_for(lambda: len(h.lifecycle.ended) == 1)
        engine.notify(CHAT)
        await h.lifecycle.wait_for(lambda: len(h.lifecycle.ended) == 2)
        await asyncio.wait_for(h.typing.wait_idle(CHAT), WAIT_SECONDS)
    finally:
        await engine.close()

    assert [status for _, status in h.lifecycle.ended] == ["failed", "completed"]


async def test_typing_while_a_turn_runs_and_not_after(h: Harness) -> None:
    h.engine.notify(CHAT)
    turn = await h.runner.next_started(1)

    await h.sends.wait_for(lambda: h.sends.calls.count(CHAT) >= 2)
    assert h.typing.holders(CHAT) == 1

    h.runner.finish(turn)
    await h.idle(CHAT)
    assert h.typing.holders(CHAT) == 0
    after = len(h.sends.calls)
    await asyncio.sleep(0.05)
    assert len(h.sends.calls) == after


async def test_typing_holds_across_a_merge(h: Harness) -> None:
    h.engine.notify(CHAT)
    await h.runner.next_started(1)
    h.engine.notify(CHAT)
    second = await h.runner.next_started(2)

    assert h.typing.holders(CHAT) == 1  # one hold for the chat's worker, not one per message
    h.runner.finish(second)
    await h.idle(CHAT)
    assert h.typing.holders(CHAT) == 0


async def test_close_cancels_in_flight_turns_cleanly(h: Harness) -> None:
    h.engine.notify(CHAT)
    h.engine.notify(OTHER)
    await h.runner.wait_for(lambda: len(h.runner.started) == 2)

    await asyncio.wait_for(h.engine.close(), WAIT_SECONDS)

    assert {t.chat_id for t in h.runner.cancelled} == {CHAT, OTHER}
    assert h.engine.idle(CHAT) and h.engine.idle(OTHER)
    assert h.typing.holders(CHAT) == h.typing.holders(OTHER) == 0
    assert h.lifecycle.aborted == []  # shutdown is not an abort: no cascade
    h.engine.notify(CHAT)  # ignored once closing
    assert h.engine.idle(CHAT)


async def test_merge_during_turn_start_does_not_run_the_aborted_turn(h: Harness) -> None:
    gate = asyncio.Event()
    h.lifecycle.start_gate = gate  # turn_started is a database write: it yields to the event loop
    h.engine.notify(CHAT)
    await h.lifecycle.wait_for(lambda: len(h.lifecycle.started) == 1)
    aborted = h.lifecycle.started[0]

    h.engine.notify(CHAT)  # inside the window, while the first turn is still being recorded
    assert aborted.aborted
    gate.set()

    first_run = await h.runner.next_started(1)
    assert first_run is not aborted, "the aborted turn ran anyway"
