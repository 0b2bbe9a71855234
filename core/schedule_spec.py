"""Reading a task's schedule: a five-field cron expression, `every <N><s|m|h|d>`, or an ISO 8601 date-time.

APScheduler's triggers decide the due times. Its CronTrigger numbers weekdays from 0 = Monday, while cron
(and people) use 0 or 7 = Sunday, 1 = Monday: the day-of-week field is translated to day names first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

CRON_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # cron's numbering: index = cron number
CRON_GAPS_CHECKED = 24  # consecutive due times of a cron expression checked against the minimum interval
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"^every\s+(\d{1,7})\s*([smhd])$", re.IGNORECASE)
_DAY_ITEM = re.compile(r"^(?P<start>\*|[a-z]{3}|\d)(?:-(?P<end>[a-z]{3}|\d))?(?:/(?P<step>\d{1,2}))?$")
UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}


class ScheduleKind(StrEnum):
    CRON = "cron"
    INTERVAL = "interval"
    ONCE = "once"


class ScheduleError(ValueError):
    """The schedule cannot be used; the message says why and how to write it."""


@dataclass(frozen=True, slots=True)
class Schedule:
    kind: ScheduleKind
    text: str  # as stored: the cron expression, `every 2m`, or the date-time
    trigger: BaseTrigger
    words: str  # for people: "every 2 minutes", "cron 0 9 * * 1 (09:00 on mon)"

    def next_due(self, after: datetime | None, now: datetime) -> datetime | None:
        """The first due time after `after` (None: the first one from `now`); None when none is left."""
        due: datetime | None = self.trigger.get_next_fire_time(after, now)
        return due


def _day_number(word: str) -> int:
    if word.isdigit():
        number = int(word)
        if number > 7:
            raise ScheduleError(f"day of week {word} is not 0-7 (0 and 7 are Sunday, 1 is Monday)")
        return number % 7
    if word not in CRON_DAY_NAMES:
        raise ScheduleError(f"unknown day {word!r}: use sun, mon, tue, wed, thu, fri, sat or 0-7")
    return CRON_DAY_NAMES.index(word)


def cron_days(field: str) -> str:
    """Cron's day-of-week field as APScheduler day names, with cron's meaning (0/7 Sunday, 1 Monday)."""
    days: set[int] = set()
    for item in field.lower().split(","):
        match = _DAY_ITEM.match(item)
        if match is None:
            raise ScheduleError(f"day of week {item!r} is not understood")
        start, end, step = match["start"], match["end"], int(match["step"] or 1)
        if step < 1:
            raise ScheduleError("a step must be at least 1")
        if start == "*":
            if end is not None:
                raise ScheduleError(f"day of week {item!r} is not understood")
            first, last = 0, 6
        else:
            first = _day_number(start)
            last = first if end is None else (7 if end in ("7", "sun") else _day_number(end))  # fri-sun: to Sunday
            if end is None and match["step"]:
                last = 6  # `1/2`: from Monday on, every second day
            if last < first:
                raise ScheduleError(f"day range {item!r} runs backwards: write it as two ranges, e.g. fri-sat,sun")
        days.update(n % 7 for n in range(first, last + 1, step))
    if len(days) == 7:
        return "*"
    return ",".join(CRON_DAY_NAMES[n] for n in sorted(days, key=lambda n: (n + 6) % 7))  # Monday first


def _cron_words(fields: list[str], day_names: str) -> str:
    minute, hour, day, month, _ = fields
    parts = []
    if minute.isdigit() and hour.isdigit():
        parts.append(f"{int(hour):02d}:{int(minute):02d}")
    if day_names != "*":
        parts.append(f"on {day_names}")
    if day != "*":
        parts.append(f"on day {day} of the month")
    if month != "*":
        parts.append(f"in month {month}")
    said = " ".join(parts)
    return f"cron {' '.join(fields)}" + (f" ({said})" if said else "")


# Due times further away are refused: nothing a chat asks for is that far off, and near datetime's limits
# (year 9999) a due time in another zone cannot even be computed.
HORIZON_YEARS = 100
HORIZON_SECONDS = HORIZON_YEARS * 365 * 24 * 3600


def _parse_cron(text: str, tz: ZoneInfo, now: datetime, min_interval_seconds: int) -> Schedule:
    fields = text.split()
    days = cron_days(fields[4])
    try:
        trigger = CronTrigger(
            minute=fields[0], hour=fields[1], day=fields[2], month=fields[3], day_of_week=days, timezone=tz
        )
    except ValueError as exc:
        raise ScheduleError(f"bad cron expression {text!r}: {exc}") from None
    schedule = Schedule(ScheduleKind.CRON, " ".join(fields), trigger, _cron_words(fields, days))
    due = schedule.next_due(None, now)
    if due is None:
        raise ScheduleError(f"cron expression {text!r} never comes due")
    for _ in range(CRON_GAPS_CHECKED):
        following = schedule.next_due(due, due)
        if following is None:
            break
        if (following - due).total_seconds() < min_interval_seconds:
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
