from __future__ import annotations

from core.backoff import backoff_seconds
from core.outbox import FIRST_RETRY_SECONDS, MAX_RETRY_SECONDS


def delays(count: int, first: float, most: float) -> list[float]:
    return [backoff_seconds(n, first_seconds=first, max_seconds=most) for n in range(1, count + 1)]


def test_the_wait_doubles_after_each_failure_up_to_its_cap() -> None:
    assert delays(8, 1.0, 60.0) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


def test_the_outbox_waits_a_second_first_and_five_minutes_at_most() -> None:
    outbox = delays(14, FIRST_RETRY_SECONDS, MAX_RETRY_SECONDS)
    assert outbox == sorted(outbox) and outbox[0] == 1.0 and outbox[-1] == 300.0


def test_no_failure_yet_waits_the_first_delay() -> None:
    assert backoff_seconds(0, first_seconds=60.0, max_seconds=86_400.0) == 60.0


def test_a_runaway_count_is_the_cap_not_an_overflow() -> None:
    assert backoff_seconds(10**6, first_seconds=60.0, max_seconds=86_400.0) == 86_400.0


def test_the_other_sides_retry_after_is_kept_but_never_below_the_first_delay() -> None:
    assert backoff_seconds(3, first_seconds=1.0, max_seconds=300.0, retry_after_seconds=42.0) == 42.0
    assert backoff_seconds(3, first_seconds=1.0, max_seconds=300.0, retry_after_seconds=0.0) == 1.0
