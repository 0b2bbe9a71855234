"""A cron task stored while both day fields had to match (`0 9 1 * mon`: the first Monday that is a 1st,
months away) is due, from the next start on, at its expression's first due time under cron's rule."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from core.schedule_spec import parse_schedule
from core.store.schedules import NewTask, ScheduleStore, TaskMode
from tests.bot.schedules.rig import CHAT, CREATOR, open_rig

DAY_SECONDS = 86_400.0
OLD_RULE_LATER_SECONDS = 150 * DAY_SECONDS  # as far off as the old reading put a Monday that is the 1st


async def stored(store: ScheduleStore, schedule: str, next_due_at: float, now: float) -> str:
    new = NewTask(CHAT, CREATOR, "stored", "$ date", schedule, "Europe/Berlin", TaskMode.SUBAGENT, next_due_at, now)
    return (await store.create(new, max_open=20)).id


async def test_a_stored_cron_task_moves_back_to_its_first_due_time_under_crons_rule(tmp_path: Path) -> None:
    now = time.time()
    rig = await open_rig(tmp_path / "db.sqlite3", start=False, clock=lambda: now)
    cron_id = await stored(rig.store, "0 9 1 * mon", now + OLD_RULE_LATER_SECONDS, now)
    interval_id = await stored(rig.store, "every 200d", now + OLD_RULE_LATER_SECONDS, now)  # its rule is unchanged
    try:
        await rig.scheduler.start()
        cron_task, interval_task = await rig.store.get(cron_id), await rig.store.get(interval_id)
        planned = rig.scheduler.planned(cron_id)
    finally:
        await rig.stop()
    at = datetime.fromtimestamp(now, UTC)
    expected = parse_schedule("0 9 1 * mon", ZoneInfo("Europe/Berlin"), now=at, min_interval_seconds=1).next_due(
        None, at
    )
    assert expected is not None and expected.timestamp() - now <= 7 * DAY_SECONDS  # a Monday within a week
    assert cron_task is not None and cron_task.next_due_at == expected.timestamp()
    assert planned is not None and planned.timestamp() == expected.timestamp()
    assert interval_task is not None and interval_task.next_due_at == now + OLD_RULE_LATER_SECONDS


async def test_a_due_time_is_not_moved_back_to_one_a_fire_has_reached(tmp_path: Path) -> None:
    now = time.time()
    rig = await open_rig(tmp_path / "db.sqlite3", start=False)
    try:
        task_id = await stored(rig.store, "0 9 1 * mon", now + 10 * DAY_SECONDS, now)
        assert await rig.store.claim(task_id, now + DAY_SECONDS, now + 30 * DAY_SECONDS) is not None
        assert not await rig.store.move_due_earlier(task_id, now + 30 * DAY_SECONDS, now + DAY_SECONDS)
        assert not await rig.store.move_due_earlier(task_id, now + 31 * DAY_SECONDS, now + 2 * DAY_SECONDS)
        assert await rig.store.move_due_earlier(task_id, now + 30 * DAY_SECONDS, now + 2 * DAY_SECONDS)
        task = await rig.store.get(task_id)
    finally:
        await rig.stop()
    assert task is not None and task.next_due_at == now + 2 * DAY_SECONDS
