"""Five-field cron expressions with cron's meaning, and their due times in a time zone.

`minute hour day-of-month month day-of-week`, each a `*`, a number, a name (jan-dec, sun-sat; 0 and 7 are
Sunday), a range (`mon-fri`, `9-17`), a step (`*/15`, `8-18/2`, `5/10`) or a list of those. The day of month
also takes `L` (the month's last day) and `LW` (its last weekday), the day of week `5L` (the month's last
Friday) and `5#2` (its second Friday). Quartz's `15W`, `?` and `L-3` are refused.

Days follow cron's rule: when the day-of-month or the day-of-week field starts with `*`, a day must match
both; when both are restricted, either (`0 9 1 * mon`: the 1st and every Monday).

Clock changes follow Debian cron (tests/core/test_cron_reference.py checks all of it against cronsim): when
neither the minute nor the hour field starts with `*`, the expression names times of day: one that a spring
change skips comes due at the first minute after the gap, one that an autumn change repeats comes due at its
first pass only. With `*` first in the minute or hour field it comes due at every instant whose clock reads
a match: none in a skipped hour, both passes of a repeated one.
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo

DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # index = cron's number
MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
SEARCH_YEARS = 100  # a due time is looked for this many years ahead; none by then: the expression never comes due
MINUTES_PER_DAY = 24 * 60
SECONDS_PER_DAY = MINUTES_PER_DAY * 60
EPOCH = date(1970, 1, 1)
MAX_NTH = 5  # `5#5`: a month has at most five of one weekday
SUNDAY_LAST = 7  # cron's second number for Sunday, so that `fri-7` runs to the end of the week
_NUMBER = re.compile(r"^[0-9]{1,2}$")
_SUPPORTED = "numbers, names, *, lists, ranges and steps; L and LW in the day of month; 5L and 5#2 in the day of week"


class CronError(ValueError):
    """The expression is not cron as this module reads it; the message says what is wrong."""


class DayRule(StrEnum):
    BOTH = "both"  # the day-of-month or day-of-week field starts with `*`: a day matches both fields
    EITHER = "either"  # both fields are restricted: a day matching either field


class ClockRule(StrEnum):
    TIMES_OF_DAY = "times of day"  # fixed minute and hour: once per day and time, a skipped one after the gap
    EVERY_MATCH = "every match"  # `*` first in minute or hour: every real instant whose clock matches


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    first_name: int = 0  # the number of names[0]
    sunday_ends: bool = False  # `sun` ending a range is 7, so that `fri-sun` is Friday to Sunday

    def value(self, word: str, *, range_end: bool = False) -> int:
        if word in self.names:
            number = self.names.index(word) + self.first_name
            return SUNDAY_LAST if range_end and self.sunday_ends and number == 0 else number
        if not _NUMBER.match(word):
            raise CronError(f"{self.name} {word!r} is not understood: use {_SUPPORTED}")
        number = int(word)
        if not self.low <= number <= self.high:
            raise CronError(f"{self.name} {number} is not {self.low}-{self.high}")
        return number

    def values(self, item: str) -> set[int]:
        """One list item: `*`, `n`, `a-b`, each optionally `/step` (`n/step` runs from n to the field's end)."""
        body, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _NUMBER.match(step_text) or int(step_text) < 1:
                raise CronError(f"{self.name} step in {item!r} is not a number from 1 to 99")
            step = int(step_text)
        if body == "*":
            first, last = self.low, self.high
        else:
            start, dash, end = body.partition("-")
            first = self.value(start)
            last = self.value(end, range_end=first > 0) if dash else (self.high if slash else first)
            if last < first:
                raise CronError(f"{self.name} range {item!r} runs backwards: write it as two, e.g. fri-sat,sun")
        return set(range(first, last + 1, step))


MINUTE = _Field("minute", 0, 59)
HOUR = _Field("hour", 0, 23)
DAY = _Field("day of month", 1, 31)
MONTH = _Field("month", 1, 12, MONTH_NAMES, 1)
WEEKDAY = _Field("day of week", 0, SUNDAY_LAST, DAY_NAMES, sunday_ends=True)


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed expression; `next_at` gives its due times."""

    fields: tuple[str, str, str, str, str]  # as written, lower case
    times: tuple[int, ...]  # minutes after midnight, ascending
    days: frozenset[int]
    last_day: bool  # `L`
    last_weekday: bool  # `LW`
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday
    last_of: frozenset[int]  # `5L`: the weekdays whose last one in the month matches
    nth: frozenset[tuple[int, int]]  # `5#2`: (weekday, which one in the month)
    day_rule: DayRule
    clock_rule: ClockRule

    def next_at(self, earliest: datetime, tz: ZoneInfo) -> datetime | None:
        """The first due time at or after `earliest` (aware), in `tz`; None if none within SEARCH_YEARS."""
        earliest = earliest.astimezone(UTC)
        local = earliest.astimezone(tz)
        # Due times are whole minutes: one later in the same minute waits for the next.
        bound = local.hour * 60 + local.minute + (1 if local.second or local.microsecond else 0)
        start = local.date()
        year, month = start.year, start.month
        last_year = min(start.year + SEARCH_YEARS, date.max.year)
        while year <= last_year:
            for day in self._month_days(year, month):
                when = date(year, month, day)
                if when < start:
                    continue
                try:
                    found = self._on_day(when, tz, earliest, bound if when == start else 0)
                except (OverflowError, ValueError):  # at the end of datetime's range (year 9999 west of UTC)
                    return None
                if found is not None:
                    return found.astimezone(tz)
            year, month = (year, month + 1) if month < 12 else (year + 1, 1)
        return None

    def _month_days(self, year: int, month: int) -> list[int]:
        if month not in self.months:
            return []
        first_weekday, length = calendar.monthrange(year, month)  # Monday = 0 there
        last_weekday = _last_weekday(year, month, length)
        found = []
        for day in range(1, length + 1):
            weekday = (first_weekday + day) % 7  # cron's: Sunday = 0
            in_month = (
                day in self.days or (self.last_day and day == length) or (self.last_weekday and day == last_weekday)
            )
            in_week = (
                weekday in self.weekdays
                or (weekday in self.last_of and day + 7 > length)
                or (weekday, (day + 6) // 7) in self.nth
            )
            if (in_month and in_week) if self.day_rule is DayRule.BOTH else (in_month or in_week):
                found.append(day)
        return found

    def _on_day(self, day: date, tz: ZoneInfo, earliest: datetime, bound: int) -> datetime | None:
        midnight = (day - EPOCH).days * SECONDS_PER_DAY  # the day's 00:00 as if it were UTC, in seconds
        before = _wall_offset(day, tz)  # as the day begins
        after = _wall_offset(day + timedelta(days=1), tz) if day < date.max else before  # as the next begins
        if before == after:  # no clock change that day: clock order is time order
            index = bisect_left(self.times, bound)
            if index == len(self.times):
                return None
            return datetime.fromtimestamp(midnight + self.times[index] * 60 - before, UTC)
        change = _change_at(midnight - before, tz, before)
        due = (at for at in self._changing_day(midnight, before, after, change) if at >= earliest.timestamp())
        first = min(due, default=None)
        return None if first is None else datetime.fromtimestamp(first, UTC)

    def _changing_day(self, midnight: int, before: int, after: int, change: int) -> Iterator[int]:
        """The due times (POSIX seconds) of a day whose clock changes at `change`, from offset `before` to
        `after`, unordered: in an autumn change the first pass of an hour comes before the second."""
        for minute in self.times:
            wall = midnight + minute * 60
            early, late = wall - before, wall - after  # the instants if the clock shows the old, the new offset
            real = [at for at, shown in ((early, early < change), (late, late >= change)) if shown]
            if not real:  # skipped by a spring change; cron runs a time of day at the first minute after it
                if self.clock_rule is ClockRule.TIMES_OF_DAY:
                    yield change + (-change) % 60
                continue
            yield real[0]  # the first pass of a repeated time
            if self.clock_rule is ClockRule.EVERY_MATCH and len(real) == 2:
                yield real[1]


def _wall_offset(day: date, tz: ZoneInfo) -> int:
    """The UTC offset in seconds at the day's 00:00 (the earlier one if the clock shows 00:00 twice)."""
    offset = tz.utcoffset(datetime.combine(day, time()))
    return 0 if offset is None else int(offset.total_seconds())


def _offset_at(posix: int, tz: ZoneInfo) -> int:
    """The zone's UTC offset in seconds at an instant."""
    offset = datetime.fromtimestamp(posix, tz).utcoffset()
    return 0 if offset is None else int(offset.total_seconds())


def _change_at(day_start: int, tz: ZoneInfo, before: int) -> int:
    """The instant (POSIX seconds) of the one clock change in the day that starts at `day_start`."""
    low, high = day_start - 1, day_start + SECONDS_PER_DAY  # the offset is `before` at low, not at high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if _offset_at(middle, tz) == before else (low, middle)
    return high


def _last_weekday(year: int, month: int, length: int) -> int:
    weekday = calendar.weekday(year, month, length)  # Monday = 0
    return length - max(0, weekday - 4)  # Saturday: the day before; Sunday: two before


def _month_day_items(field: str) -> tuple[set[int], bool, bool]:
    days: set[int] = set()
    last_day = last_weekday = False
    for item in field.split(","):
        if item == "l":
            last_day = True
        elif item == "lw":
            last_weekday = True
        elif "w" in item or item.startswith("l") or item == "?":
            raise CronError(
                f"day of month {item!r} is not supported: L (last day) and LW (last weekday) are; "
                "for the weekday nearest a date, list the days"
            )
        else:
            days |= DAY.values(item)
    return days, last_day, last_weekday


def _weekday_items(field: str) -> tuple[set[int], set[int], set[tuple[int, int]]]:
    weekdays: set[int] = set()
    last_of: set[int] = set()
    nth: set[tuple[int, int]] = set()
    for item in field.split(","):
        if "#" in item:
            day, _, which = item.partition("#")
            if not _NUMBER.match(which) or not 1 <= int(which) <= MAX_NTH:
                raise CronError(f"day of week {item!r}: the number after # is 1 to {MAX_NTH}")
            nth.add((WEEKDAY.value(day) % 7, int(which)))
        elif len(item) > 1 and item.endswith("l") and "-" not in item and "/" not in item:
            last_of.add(WEEKDAY.value(item[:-1]) % 7)
        elif item in ("l", "?"):
            raise CronError(f"day of week {item!r} is not supported: use {_SUPPORTED}")
        else:
            weekdays |= {n % 7 for n in WEEKDAY.values(item)}
    return weekdays, last_of, nth


def parse_cron(text: str) -> Cron:
    """Five whitespace-separated fields, case-insensitive; CronError says what is wrong."""
    words = text.lower().split()
    if len(words) != 5:
        raise CronError(f"a cron expression has five fields (minute hour day-of-month month day-of-week): {text!r}")
    minute, hour, day, month, weekday = words
    minutes: set[int] = set()
    hours: set[int] = set()
    months: set[int] = set()
    for item in minute.split(","):
        minutes |= MINUTE.values(item)
    for item in hour.split(","):
        hours |= HOUR.values(item)
    for item in month.split(","):
        months |= MONTH.values(item)
    days, last_day, last_weekday = _month_day_items(day)
    weekdays, last_of, nth = _weekday_items(weekday)
    # Vixie and Debian cron look at the first character: `*/2` in either field makes the days match both.
    day_rule = DayRule.BOTH if day.startswith("*") or weekday.startswith("*") else DayRule.EITHER
    clock_rule = ClockRule.EVERY_MATCH if minute.startswith("*") or hour.startswith("*") else ClockRule.TIMES_OF_DAY
    return Cron(
        fields=(minute, hour, day, month, weekday),
        times=tuple(sorted(h * 60 + m for h in hours for m in minutes)),
        days=frozenset(days),
        last_day=last_day,
        last_weekday=last_weekday,
        months=frozenset(months),
        weekdays=frozenset(weekdays),
        last_of=frozenset(last_of),
        nth=frozenset(nth),
        day_rule=day_rule,
        clock_rule=clock_rule,
    )
