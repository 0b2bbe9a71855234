"""The real APScheduler on a real database: due times fire on time, once, across restarts and rival
start-ups; late ones run inside the misfire grace and are skipped (and recorded) outside it."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from core.store.schedules import FireStatus, NewTask, TaskMode, TaskStatus
from tests.bot.schedules.rig import CHAT, CREATOR, CRON_WAIT_SECONDS, WAIT_SECONDS, Rig, open_rig

HOUR_SECONDS = 3600.0


async def wait_until_planned_ahead(*rigs: Rig, task_id: str) -> None:
    """Until every rig's scheduler has dealt with the task's past due time (its job is in the future)."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            planned = [rig.scheduler.planned(task_id) for rig in rigs]
            if all(p is not None and p.timestamp() > time.time() for p in planned):
                return
            await asyncio.sleep(0.02)


async def overdue_task(
    rig: Rig, seconds_late: float, schedule: str = "every 1h", interval_seconds: float = HOUR_SECONDS
) -> str:
    """A task whose due time passed while no bot ran: as the database holds it after downtime."""
    now = time.time()
    task = await rig.store.create(
        NewTask(
            chat_id=CHAT,
            creator_id=CREATOR,
            label="overdue",
            prompt="$ echo late",
            schedule=schedule,
            timezone="UTC",
            mode=TaskMode.SUBAGENT,
            next_due_at=now - seconds_late,
            created_at=now - seconds_late - interval_seconds,  # the first due time is one interval in
        ),
        max_open=20,
    )
    return task.id


async def test_an_interval_task_fires_at_each_due_time_once(tmp_path: Path) -> None:
    rig = await open_rig(tmp_path / "db.sqlite3")
    try:
        task = await rig.book.schedule(CHAT, CREATOR, "$ date", "every 2s", label="clock")
        spawned = await rig.spawner.wait_for(2)
        history = sorted(await rig.store.history(task.id), key=lambda f: f.due_at)
    finally:
        await rig.stop()
    # The first due time is one interval after creation; later ones stay on that 2 s grid (a loaded
    # machine may coalesce one that passed while the previous ran). Datetimes keep microseconds.
    offsets = [f.due_at - task.created_at for f in history]
    assert offsets[0] == pytest.approx(2.0, abs=1e-5)
    assert all(o == pytest.approx(2.0 * round(o / 2.0), abs=1e-5) for o in offsets)
    assert offsets == sorted(set(offsets))
    assert all(s.at >= f.due_at for s, f in zip(spawned, history, strict=False))  # never early
    assert [s.label for s in spawned[:2]] == ["clock", "clock"]


async def test_a_one_off_fires_once_then_the_task_is_completed(tmp_path: Path) -> None:
    rig = await open_rig(tmp_path / "db.sqlite3")
    try:
        when = datetime.now(UTC) + timedelta(seconds=1.5)
        task = await rig.book.schedule(CHAT, CREATOR, "$ echo hi", when.isoformat())
        spawned = await rig.spawner.wait_for(1)
        ended = await rig.store.get(task.id)
    finally:
        await rig.stop()
    assert len(spawned) == 1 and spawned[0].at >= when.timestamp()
    assert ended is not None and ended.status is TaskStatus.COMPLETED and ended.next_due_at is None
    assert rig.scheduler.planned(task.id) is None


async def test_a_cron_task_is_planned_at_its_cron_time_and_fires_there(tmp_path: Path) -> None:
    rig = await open_rig(tmp_path / "db.sqlite3")
    try:
        sunday = await rig.book.schedule(CHAT, CREATOR, "weekly", "30 9 * * 0")
        planned = rig.scheduler.planned(sunday.id)
        assert planned is not None and planned.strftime("%A %H:%M") == "Sunday 09:30"
        assert planned.timestamp() > time.time()
        # Every minute (the finest cron has): the next minute boundary is within 60 s.
        minutely = await rig.book.schedule(CHAT, CREATOR, "$ date", "* * * * *")
        due = rig.scheduler.planned(minutely.id)
        spawned = await rig.spawner.wait_for(1, CRON_WAIT_SECONDS)
    finally:
        await rig.stop()
    assert due is not None and due.second == 0 and spawned[0].at >= due.timestamp()


async def test_a_due_time_missed_while_down_runs_once_inside_the_grace(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    rig = await open_rig(path, start=False)
    task_id = await overdue_task(rig, seconds_late=60)  # grace is 300
    await rig.stop()

    rig = await open_rig(path)  # the start after the downtime
    try:
        await rig.spawner.wait_for(1)
        await wait_until_planned_ahead(rig, task_id=task_id)
        await rig.settled_history(task_id)
    finally:
        await rig.stop()
    again = await open_rig(path)  # and another restart: nothing of it runs again
    try:
        await wait_until_planned_ahead(again, task_id=task_id)
        history = await again.store.history(task_id)
    finally:
        await again.stop()
    assert len(rig.spawner.spawned) == 1 and again.spawner.spawned == []
    assert [f.status for f in history] == [FireStatus.RUNNING]


async def test_a_due_time_missed_beyond_the_grace_is_skipped_and_recorded(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    rig = await open_rig(path, start=False, grace_seconds=300)
    task_id = await overdue_task(rig, seconds_late=1000)
    await rig.stop()

    rig = await open_rig(path, grace_seconds=300)
    try:
        await wait_until_planned_ahead(rig, task_id=task_id)
        history = await rig.store.history(task_id)
        listed = await rig.book.list_text(CHAT)
        shown = await rig.book.history_text(CHAT, task_id)
    finally:
        await rig.stop()
    assert rig.spawner.spawned == []
    assert [f.status for f in history] == [FireStatus.SKIPPED]
    assert history[0].detail is not None and "missed" in history[0].detail and "1000s late" in history[0].detail
    assert "last: skipped: missed" in listed
    assert "UTC skipped: missed: due " in shown.splitlines()[1]


async def test_after_a_long_downtime_the_last_due_time_inside_the_grace_runs_once(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    rig = await open_rig(path, start=False, grace_seconds=300)
    # Due every minute; the stored due time is 1000 s old, the ones of the last 300 s are inside the grace.
    task_id = await overdue_task(rig, seconds_late=1000, schedule="every 1m", interval_seconds=60)
    await rig.stop()

    rig = await open_rig(path, grace_seconds=300)
    try:
        [spawned] = await rig.spawner.wait_for(1)
        await wait_until_planned_ahead(rig, task_id=task_id)
        history = sorted(await rig.settled_history(task_id), key=lambda f: f.due_at)
    finally:
        await rig.stop()
    assert [f.status for f in history] == [FireStatus.SKIPPED, FireStatus.RUNNING]
    skipped, ran = history
    assert spawned.at - 300 <= ran.due_at <= spawned.at  # the due time inside the grace, run after it came
    assert ran.due_at - skipped.due_at == pytest.approx(round((ran.due_at - skipped.due_at) / 60) * 60, abs=1e-3)
    assert len(rig.spawner.spawned) == 1


async def test_two_start_ups_racing_on_one_database_run_a_due_time_once(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    first = await open_rig(path, start=False)
    task_id = await overdue_task(first, seconds_late=5)
    second = await open_rig(path, start=False)
    try:
        await asyncio.gather(first.scheduler.start(), second.scheduler.start())
        await wait_until_planned_ahead(first, second, task_id=task_id)
        history = await first.settled_history(task_id)
    finally:
        await first.stop()
        await second.stop()
    assert len(first.spawner.spawned) + len(second.spawner.spawned) == 1
    assert len(history) == 1


async def test_a_task_over_the_cap_waits_its_turn(tmp_path: Path) -> None:
    rig = await open_rig(tmp_path / "db.sqlite3", start=False)
    rig.spawner.refuse = 3  # the caps are full for the first three tries
    task_id = await overdue_task(rig, seconds_late=1)
    await rig.scheduler.start()
    try:
        spawned = await rig.spawner.wait_for(1)
        history = await rig.settled_history(task_id)
    finally:
        await rig.stop()
    assert len(spawned) == 1 and rig.spawner.refuse == 0
    assert [(f.status, f.run_id) for f in history] == [(FireStatus.RUNNING, "run1")]
    assert history[0].detail is not None and history[0].detail.startswith("waiting:")  # it waited, was not dropped


async def test_a_due_time_inside_the_back_off_is_skipped(tmp_path: Path) -> None:
    rig = await open_rig(tmp_path / "db.sqlite3", start=False)
    task_id = await overdue_task(rig, seconds_late=1)
    await rig.store.record_outcome(task_id, failed=True)
    await rig.store.set_backoff(task_id, time.time() + HOUR_SECONDS)
    await rig.scheduler.start()
    try:
        await wait_until_planned_ahead(rig, task_id=task_id)
        history = await rig.store.history(task_id)
    finally:
        await rig.stop()
    assert rig.spawner.spawned == []
    assert [(f.status, f.detail) for f in history] == [(FireStatus.SKIPPED, "backing off after 1 failure(s) in a row")]


async def test_a_due_time_waiting_for_a_slot_does_not_hold_up_the_next(tmp_path: Path) -> None:
    rig = await open_rig(tmp_path / "db.sqlite3")
    rig.spawner.refuse = 1_000_000  # the caps stay full
    try:
        task = await rig.book.schedule(CHAT, CREATOR, "$ date", "every 1s")
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                history = await rig.store.history(task.id)
                if len(history) >= 3:
                    break
                await asyncio.sleep(0.05)
    finally:
        await rig.stop()
    assert {f.status for f in history} <= {FireStatus.WAITING, FireStatus.CLAIMED, FireStatus.STARTING}
    assert rig.spawner.spawned == []
