"""Reading a task's schedule: a five-field cron expression, `every <N><s|m|h|d>`, or an ISO 8601 date-time.

Cron's due times come from core/cron.py (cron's meaning, Debian cron's clock changes); intervals and
one-offs from APScheduler's triggers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol
from zoneinfo import ZoneInfo

from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from core.cron import DAY_NAMES, Cron, CronError, DayRule, parse_cron

CRON_GAPS_CHECKED = 24  # consecutive due times of a cron expression checked against the minimum interval
ORDINALS = {1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 5: "5th"}  # `5#2`: the 2nd Friday
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"^every\s+(\d{1,7})\s*([smhd])$", re.IGNORECASE)
UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}


class ScheduleKind(StrEnum):
    CRON = "cron"
    INTERVAL = "interval"
    ONCE = "once"


class Trigger(Protocol):
    """APScheduler's trigger call, which core/cron.py's expressions answer too."""

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None: ...


class ScheduleError(ValueError):
    """The schedule cannot be used; the message says why and how to write it."""


@dataclass(frozen=True, slots=True)
class Schedule:
    kind: ScheduleKind
    text: str  # as stored: the cron expression, `every 2m`, or the date-time
    trigger: Trigger
    words: str  # for people: "every 2 minutes", "cron 0 9 * * 1 (09:00 on mon)"

    def next_due(self, after: datetime | None, now: datetime) -> datetime | None:
        """The first due time after `after` (None: the first one from `now`); None when none is left."""
        due: datetime | None = self.trigger.get_next_fire_time(after, now)
        return due


class CronDue:
    """A core/cron.py expression behind APScheduler's trigger call, read as its CronTrigger reads the call."""

    __slots__ = ("cron", "timezone")

    def __init__(self, cron: Cron, tz: ZoneInfo) -> None:
        self.cron = cron
        self.timezone = tz

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        earliest = now
        if previous_fire_time is not None:
            # In UTC: local arithmetic drops a repeated hour's fold, and Python never finds a time in a
            # repeated hour equal to one in another zone.
            previous = previous_fire_time.astimezone(UTC)
            earliest = min(now.astimezone(UTC), previous + timedelta(microseconds=1))
            if earliest == previous:
                earliest += timedelta(microseconds=1)
        return self.cron.next_at(earliest, self.timezone)


def _weekday_words(cron: Cron) -> str:
    monday_first = sorted(cron.weekdays, key=lambda n: (n + 6) % 7)
    said = [DAY_NAMES[n] for n in monday_first]
    said += [f"the last {DAY_NAMES[n]}" for n in sorted(cron.last_of)]
    said += [f"the {ORDINALS[which]} {DAY_NAMES[n]}" for n, which in sorted(cron.nth)]
    return ",".join(said)


def _month_day_words(field: str) -> str:
    items = field.split(",")
    said = [f"day {','.join(item for item in items if item not in ('l', 'lw'))} of the month"]
    said = said if any(item not in ("l", "lw") for item in items) else []
    said += ["the last day of the month"] if "l" in items else []
    said += ["the last weekday of the month"] if "lw" in items else []
    return " and ".join(said)


def _cron_words(text: str, cron: Cron) -> str:
    minute, hour, day, month, weekday = cron.fields
    parts = []
    if minute.isdigit() and hour.isdigit():
        parts.append(f"{int(hour):02d}:{int(minute):02d}")
    days = [f"on {_weekday_words(cron)}"] if weekday != "*" else []
    days += [f"on {_month_day_words(day)}"] if day != "*" else []
    if days:
        parts.append(" or ".join(reversed(days)) if cron.day_rule is DayRule.EITHER else " ".join(days))
    if month != "*":
        parts.append(f"in month {month}")
    said = " ".join(parts)
    return f"cron {text}" + (f" ({said})" if said else "")


# Due times further away are refused: nothing a chat asks for is that far off, and near datetime's limits
# (year 9999) a due time in another zone cannot even be computed.
HORIZON_YEARS = 100
HORIZON_SECONDS = HORIZON_YEARS * 365 * 24 * 3600


def _parse_cron(text: str, tz: ZoneInfo, now: datetime, min_interval_seconds: int) -> Schedule:
    try:
        cron = parse_cron(text)
    except CronError as exc:
        raise ScheduleError(f"bad cron expression {text!r}: {exc}") from None
    schedule = Schedule(ScheduleKind.CRON, text, CronDue(cron, tz), _cron_words(text, cron))
    due = schedule.next_due(None, now)
    if due is None:
        raise ScheduleError(f"cron expression {text!r} never comes due")
    for _ in range(CRON_GAPS_CHECKED):
        following = schedule.next_due(due, due)
        if following is None:
            break
        # Timestamps: two local times an autumn change apart differ by their fold only, which `-` ignores.
        if following.timestamp() - due.timestamp() < min_interval_seconds:
            raise ScheduleError(
                f"{text!r} comes due more often than the minimum interval of {min_interval_seconds} seconds"
            )
        due = following
    return schedule


def _parse_every(match: re.Match[str], tz: ZoneInfo, start: datetime, min_interval_seconds: int) -> Schedule:
    count, unit = int(match[1]), match[2].lower()
    seconds = count * UNIT_SECONDS[unit]
    if seconds > HORIZON_SECONDS:
        raise ScheduleError(f"every {count}{unit} is longer than {HORIZON_YEARS} years")
    if seconds < min_interval_seconds:
        raise ScheduleError(
            f"every {count}{unit} is shorter than the minimum interval of {min_interval_seconds} seconds"
        )
    # The first due time is one interval after the task was made, not at once; rebuilt from the same
    # creation time after a restart, the due times stay where they were.
    trigger = IntervalTrigger(seconds=seconds, start_date=start + timedelta(seconds=seconds), timezone=tz)
    words = f"every {count} {UNIT_WORDS[unit]}{'s' if count != 1 else ''}"
    return Schedule(ScheduleKind.INTERVAL, f"every {count}{unit}", trigger, words)


def _parse_once(text: str, tz: ZoneInfo, now: datetime, check_past: bool) -> Schedule:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ScheduleError(
            f"{text[:60]!r} is not a schedule: write a five-field cron expression (0 9 * * mon), "
            "`every <N><s|m|h|d>` (every 2h), or an ISO 8601 date-time (2026-12-01T09:00)"
        ) from None
    when = when.replace(tzinfo=tz) if when.tzinfo is None else when
    if check_past and when <= now:
        raise ScheduleError(f"{text} is in the past")
    try:
        beyond = when - now > timedelta(seconds=HORIZON_SECONDS)
    except OverflowError:  # at the edge of datetime's range (year 1 or 9999 in a far zone)
        beyond = True
    if beyond:
        raise ScheduleError(f"{text} is more than {HORIZON_YEARS} years away")
    shown = when.astimezone(tz).strftime("%Y-%m-%d %H:%M")
    return Schedule(ScheduleKind.ONCE, when.isoformat(), DateTrigger(run_date=when, timezone=tz), f"once at {shown}")


def parse_schedule(
    text: str,
    tz: ZoneInfo,
    *,
    now: datetime,
    created_at: datetime | None = None,
    min_interval_seconds: int,
    check_past: bool = True,
) -> Schedule:
    """The schedule `text` read in `tz`; an interval counts from `created_at` (default: `now`).

    `check_past=False` rebuilds a stored one-off whose time has passed (the scheduler decides about it)."""
    text = " ".join(text.split())
    if not text:
        raise ScheduleError("the schedule is empty")
    every = _EVERY.match(text)
    if every is not None:
        return _parse_every(every, tz, created_at or now, min_interval_seconds)
    if len(text.split()) == 5:
        return _parse_cron(text, tz, now, min_interval_seconds)
    return _parse_once(text, tz, now, check_past)


def in_zone(ts: float, tz: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(ts, tz)


def shown_time(ts: float | None, tz: ZoneInfo) -> str:
    """A due time as the chat reads it: `2026-12-01 09:00 Europe/Berlin`."""
    if ts is None:
        return "never"
    return f"{in_zone(ts, tz).strftime('%Y-%m-%d %H:%M')} {tz.key}"
