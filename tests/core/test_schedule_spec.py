"""Schedules as people write them: cron with cron's weekday numbers, `every <N><unit>`, ISO date-times."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from core.cron import CronError, parse_cron
from core.schedule_spec import ScheduleError, ScheduleKind, parse_schedule

UTC = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")
MONDAY_4AM = datetime(2026, 11, 23, 4, 0, tzinfo=UTC)  # 2026-11-23 is a Monday


def first_due(text: str, tz: ZoneInfo = UTC, min_interval: int = 300) -> datetime:
    schedule = parse_schedule(text, tz, now=MONDAY_4AM, min_interval_seconds=min_interval)
    due = schedule.next_due(None, MONDAY_4AM)
    assert due is not None
    return due


@pytest.mark.parametrize(
    ("expression", "weekday"),
    [
        ("0 9 * * 1", "Monday"),
        ("0 9 * * 0", "Sunday"),  # APScheduler's from_crontab would make this a Monday
        ("0 9 * * 7", "Sunday"),
        ("0 9 * * mon", "Monday"),
        ("0 9 * * SUN", "Sunday"),
        ("0 9 * * 5", "Friday"),
        ("0 9 * * fri-sun", "Friday"),
    ],
)
def test_cron_weekdays_mean_what_cron_means(expression: str, weekday: str) -> None:
    due = first_due(expression)
    assert due.strftime("%A %H:%M") == f"{weekday} 09:00"


def test_cron_weekday_lists_ranges_and_steps() -> None:
    def weekdays(field: str) -> set[int]:  # cron's numbers: 0 = Sunday
        return set(parse_cron(f"0 9 * * {field}").weekdays)

    assert weekdays("1-5") == {1, 2, 3, 4, 5}
    assert weekdays("*/2") == {0, 2, 4, 6}
    assert weekdays("0,6") == {0, 6}
    assert weekdays("5-7") == weekdays("fri-sun") == {5, 6, 0}
    assert weekdays("0-7") == set(range(7))
    assert weekdays("1/2") == {1, 3, 5, 0}  # from Monday to cron's 7, Sunday, as cron and cronsim read it
    with pytest.raises(CronError, match="backwards"):
        parse_cron("0 9 * * 5-2")
    with pytest.raises(CronError, match="0-7"):
        parse_cron("0 9 * * 8")


def test_cron_is_read_in_the_chats_time_zone() -> None:
    due = first_due("0 9 * * *", BERLIN)
    assert due.astimezone(BERLIN).strftime("%H:%M") == "09:00"
    assert due.astimezone(UTC).strftime("%H:%M") == "08:00"  # Berlin is UTC+1 in November


def test_interval_counts_from_creation() -> None:
    schedule = parse_schedule("every 2m", UTC, now=MONDAY_4AM, min_interval_seconds=60)
    assert schedule.kind is ScheduleKind.INTERVAL
    assert schedule.words == "every 2 minutes"
    first = schedule.next_due(None, MONDAY_4AM)
    assert first == datetime(2026, 11, 23, 4, 2, tzinfo=UTC)
    assert schedule.next_due(first, first) == datetime(2026, 11, 23, 4, 4, tzinfo=UTC)


def test_one_off_in_the_chats_zone() -> None:
    schedule = parse_schedule("2026-12-01T09:00", BERLIN, now=MONDAY_4AM, min_interval_seconds=300)
    assert schedule.kind is ScheduleKind.ONCE
    due = schedule.next_due(None, MONDAY_4AM)
    assert due is not None and due.astimezone(UTC) == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("every 1m", "minimum interval of 300 seconds"),
        ("* * * * *", "minimum interval of 300 seconds"),
        ("*/2 * * * *", "minimum interval"),
        ("61 9 * * *", "bad cron expression"),
        ("0 9 * * xyz", "day of week 'xyz' is not understood"),
        ("2020-01-01T09:00", "in the past"),
        ("tomorrow-ish", "not a schedule"),
        ("", "empty"),
    ],
)
def test_bad_schedules_are_refused_with_a_reason(text: str, says: str) -> None:
    with pytest.raises(ScheduleError, match=says):
        parse_schedule(text, UTC, now=MONDAY_4AM, min_interval_seconds=300)
