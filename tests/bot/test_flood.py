"""A flooding chat is told once per window; quiet chats never are."""

from __future__ import annotations

from bot.flood import FloodGuard


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_notice_once_per_window_and_again_after_it() -> None:
    clock = Clock()
    guard = FloodGuard(max_triggers=3, window_seconds=10, clock=clock)
    answers = [guard.should_notice(1) for _ in range(10)]
    assert answers == [False, False, False, True] + [False] * 6
    clock.now += 11
    assert [guard.should_notice(1) for _ in range(4)] == [False, False, False, True]


def test_chats_are_counted_apart_and_a_steady_pace_is_fine() -> None:
    clock = Clock()
    guard = FloodGuard(max_triggers=3, window_seconds=10, clock=clock)
    for _ in range(20):
        clock.now += 4  # at most three in any ten seconds
        assert not guard.should_notice(1)
        assert not guard.should_notice(2)


def test_a_chat_that_went_quiet_is_forgotten_and_then_counted_afresh() -> None:
    clock = Clock()
    guard = FloodGuard(max_triggers=3, window_seconds=10, clock=clock)
    for chat_id in range(1, 101):
        guard.should_notice(chat_id)
    assert [guard.should_notice(7) for _ in range(3)] == [False, False, True]
    assert guard.tracked_chats() == 100
    clock.now += 11
    assert not guard.should_notice(1)  # a window later: only the chat that spoke since is kept
    assert guard.tracked_chats() == 1
    assert [guard.should_notice(7) for _ in range(4)] == [False, False, False, True]
