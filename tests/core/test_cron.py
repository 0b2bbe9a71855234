"""Cron with cron's meaning: either day field when both are restricted, L, LW, 5L and 5#2, what is refused,
and the clock changes as Debian cron takes them (core/cron.py's docstring)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from core.cron import CronError, parse_cron
from core.schedule_spec import ScheduleError, parse_schedule

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
NEW_YEARS_EVE = datetime(2025, 12, 31, 12, tzinfo=UTC)  # a Wednesday


def due_times(text: str, tz: ZoneInfo, start: datetime, count: int) -> list[str]:
    """The next `count` due times after `start`, on the clock of `tz` with its offset."""
    schedule = parse_schedule(text, tz, now=start, min_interval_seconds=1)
    found: list[str] = []
    at: datetime | None = start
    while at is not None and len(found) < count:
        at = schedule.next_due(at, at)
        if at is not None:
            found.append(at.astimezone(tz).strftime("%a %Y-%m-%d %H:%M%z"))
    return found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The findings: the 1st or any Monday, not a Monday that is the 1st (first in 2026-06).
        ("0 9 1 * mon", ["Thu 2026-01-01 09:00", "Mon 2026-01-05 09:00", "Mon 2026-01-12 09:00"]),
        ("0 12 15 * 5", ["Fri 2026-01-02 12:00", "Fri 2026-01-09 12:00", "Thu 2026-01-15 12:00"]),
        ("0 0 1,15 * 3", ["Thu 2026-01-01 00:00", "Wed 2026-01-07 00:00", "Wed 2026-01-14 00:00"]),
        ("0 0 13 * fri", ["Fri 2026-01-02 00:00", "Fri 2026-01-09 00:00", "Tue 2026-01-13 00:00"]),
        # A field starting with `*` (even `*/2`) makes the days match both, as in Vixie and Debian cron.
        ("0 0 */2 * mon", ["Mon 2026-01-05 00:00", "Mon 2026-01-19 00:00", "Mon 2026-02-09 00:00"]),
        ("0 0 * * mon", ["Mon 2026-01-05 00:00", "Mon 2026-01-12 00:00", "Mon 2026-01-19 00:00"]),
        ("0 18 L * *", ["Wed 2025-12-31 18:00", "Sat 2026-01-31 18:00", "Sat 2026-02-28 18:00"]),
        ("0 18 LW * *", ["Wed 2025-12-31 18:00", "Fri 2026-01-30 18:00", "Fri 2026-02-27 18:00"]),
        ("0 9 * * 5L", ["Fri 2026-01-30 09:00", "Fri 2026-02-27 09:00", "Fri 2026-03-27 09:00"]),
        ("0 9 * * fri#2", ["Fri 2026-01-09 09:00", "Fri 2026-02-13 09:00", "Fri 2026-03-13 09:00"]),
        ("0 9 1 * 5#2", ["Thu 2026-01-01 09:00", "Fri 2026-01-09 09:00", "Sun 2026-02-01 09:00"]),
        ("30 8 * jan-mar/2 SAT-sun", ["Sat 2026-01-03 08:30", "Sun 2026-01-04 08:30", "Sat 2026-01-10 08:30"]),
    ],
)
def test_days_follow_crons_rule(text: str, expected: list[str]) -> None:
    assert due_times(text, ZoneInfo("UTC"), NEW_YEARS_EVE, 3) == [f"{when}+0000" for when in expected]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0 9 15W * *", "not supported: L .* and LW .* are"),
        ("0 9 L-3 * *", "not supported"),
        ("0 9 ? * mon", "not supported"),
        ("0 9 * * L", "not supported"),
        ("0 9 * * 5#6", "the number after # is 1 to 5"),
        ("0 9 * * 1-5L", "not understood"),
        ("0 9 * * mon-fri/0", "step"),
        ("0 9 * 13 *", "month 13 is not 1-12"),
        ("0 9 0 * *", "day of month 0 is not 1-31"),
        ("0 9 * * fri-mon", "runs backwards"),
    ],
)
def test_what_cron_does_not_have_is_refused_saying_what_it_does_have(text: str, says: str) -> None:
    with pytest.raises(CronError, match=says):
        parse_cron(text)
    with pytest.raises(ScheduleError, match="bad cron expression"):
        parse_schedule(text, BERLIN, now=NEW_YEARS_EVE, min_interval_seconds=300)


def test_a_day_no_month_has_never_comes_due() -> None:
    with pytest.raises(ScheduleError, match="never comes due"):
        parse_schedule("0 0 30 feb *", BERLIN, now=NEW_YEARS_EVE, min_interval_seconds=300)
    # Either day field: the 31st of February never, every Monday of February still.
    assert due_times("0 0 31 feb mon", BERLIN, NEW_YEARS_EVE, 1) == ["Mon 2026-02-02 00:00+0100"]


def test_a_time_of_day_a_spring_change_skips_comes_due_just_after_it() -> None:
    night = datetime(2026, 3, 28, 12, tzinfo=UTC)  # Berlin's clocks go from 02:00 to 03:00 on 29 March
    assert due_times("30 2 * * *", BERLIN, night, 3) == [
        "Sun 2026-03-29 03:00+0200",
        "Mon 2026-03-30 02:30+0200",
        "Tue 2026-03-31 02:30+0200",
    ]
    assert due_times("15 1-3 * * *", BERLIN, night, 4) == [
        "Sun 2026-03-29 01:15+0100",
        "Sun 2026-03-29 03:00+0200",  # 02:15, which the clock never shows
        "Sun 2026-03-29 03:15+0200",
        "Mon 2026-03-30 01:15+0200",
    ]


def test_a_time_of_day_an_autumn_change_repeats_comes_due_once() -> None:
    night = datetime(2026, 10, 24, 12, tzinfo=UTC)  # Berlin's clocks go from 03:00 back to 02:00 on 25 October
    assert due_times("30 2 * * *", BERLIN, night, 2) == ["Sun 2026-10-25 02:30+0200", "Mon 2026-10-26 02:30+0100"]
    inside = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)  # 02:10 in the second pass
    assert due_times("30 2 * * *", BERLIN, inside, 1) == ["Mon 2026-10-26 02:30+0100"]


def test_a_star_in_minute_or_hour_follows_the_real_clock_through_both_changes() -> None:
    spring = datetime(2026, 3, 8, 6, 15, tzinfo=UTC)  # New York: 01:15 EST, 02:00 becomes 03:00
    assert due_times("*/30 * * * *", NEW_YORK, spring, 3) == [
        "Sun 2026-03-08 01:30-0500",
        "Sun 2026-03-08 03:00-0400",
        "Sun 2026-03-08 03:30-0400",
    ]
    autumn = datetime(2026, 11, 1, 4, 45, tzinfo=UTC)  # 00:45 EDT, 02:00 becomes 01:00
    assert due_times("0 * * * *", NEW_YORK, autumn, 3) == [
        "Sun 2026-11-01 01:00-0400",
        "Sun 2026-11-01 01:00-0500",
        "Sun 2026-11-01 02:00-0500",
    ]


def test_a_half_hour_clock_change_is_taken_by_the_same_rules() -> None:
    # Lord Howe Island moves its clock by 30 minutes; cronsim steps hours by 3600 s there, so it is checked here.
    lord_howe = ZoneInfo("Australia/Lord_Howe")
    autumn = datetime(2026, 4, 4, 13, 29, tzinfo=UTC)  # 5 April: 02:00 becomes 01:30
    assert due_times("46 * * * *", lord_howe, autumn, 4) == [
        "Sun 2026-04-05 00:46+1100",
        "Sun 2026-04-05 01:46+1100",
        "Sun 2026-04-05 01:46+1030",
        "Sun 2026-04-05 02:46+1030",
    ]
    spring = datetime(2026, 10, 3, 12, tzinfo=UTC)  # 4 October: 02:00 becomes 02:30
    assert due_times("15 2 * * *", lord_howe, spring, 2) == ["Sun 2026-10-04 02:30+1100", "Mon 2026-10-05 02:15+1100"]


def test_the_minimum_interval_is_measured_in_real_time_across_an_autumn_change() -> None:
    # 01:00 EDT and 01:00 EST are an hour apart though the clock reads the same.
    now = datetime(2026, 11, 1, 4, 45, tzinfo=UTC)
    schedule = parse_schedule("0 * * * *", NEW_YORK, now=now, min_interval_seconds=3600)
    first = schedule.next_due(None, now)
    assert first is not None
    second = schedule.next_due(first, first)
    assert second is not None and second - first == timedelta(0)  # as local times; in real time:
    assert second.timestamp() - first.timestamp() == 3600


def test_words_say_either_day() -> None:
    def words(text: str) -> str:
        return parse_schedule(text, BERLIN, now=NEW_YEARS_EVE, min_interval_seconds=1).words

    assert words("0 9 1 * mon") == "cron 0 9 1 * mon (09:00 on day 1 of the month or on mon)"
    assert words("0 9 * * 1") == "cron 0 9 * * 1 (09:00 on mon)"
    assert words("0 18 L * *") == "cron 0 18 L * * (18:00 on the last day of the month)"
    assert words("0 9 1,LW * 5L,3#2") == (
        "cron 0 9 1,LW * 5L,3#2 (09:00 on day 1 of the month and the last weekday of the month "
        "or on the last fri,the 2nd wed)"
    )
