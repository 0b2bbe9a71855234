"""When tasks are due: APScheduler's AsyncIOScheduler holds one job per active task, at the task's stored next
due time, and the task's own cron, interval or date trigger computes the due time after it.

The database is the truth. At start the jobs are rebuilt from it; a due time that passed while the bot was
down runs once if it is within SCHEDULE_MISFIRE_GRACE_SECONDS (APScheduler's misfire grace), else it is
recorded as skipped. Each job carries its due time, which is the claim's key: whichever process inserts
the fire row first runs it, any other finds it taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from apscheduler.events import EVENT_JOB_MISSED, JobEvent
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger

from core.logging import get_logger
from core.schedule_spec import Schedule, ScheduleError, ScheduleKind, parse_schedule, shown_time
from core.store.schedules import Fire, ScheduleStore, TaskRecord, TaskStatus

log = get_logger(__name__)

# A task's job re-plans itself from inside its own run; APScheduler's one-instance guard would then drop a
# next due time that is already due. Overlap is harmless: each instance claims its own due time.
MAX_JOB_INSTANCES = 16


class FireHandler(Protocol):
    """What a claimed due time does (bot/schedules/firing.py)."""

    async def run(self, fire: Fire, task: TaskRecord) -> None: ...

    async def resume(self) -> None:
        """At start: carry on with the due times an earlier process claimed and did not finish."""


def task_schedule(task: TaskRecord, now: datetime, min_interval_seconds: int = 1) -> Schedule:
    """A stored task's schedule, as it was accepted (the minimum interval was checked when it was made)."""
    return parse_schedule(
        task.schedule,
        ZoneInfo(task.timezone),
        now=now,
        created_at=datetime.fromtimestamp(task.created_at, UTC),
        min_interval_seconds=min_interval_seconds,
        check_past=False,
    )


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class TaskScheduler:
    def __init__(
        self,
        store: ScheduleStore,
        handler: FireHandler,
        *,
        misfire_grace_seconds: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._handler = handler
        self._grace_seconds = misfire_grace_seconds
        self._clock = clock
        self._scheduler: AsyncIOScheduler | None = None
        self._running: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        scheduler = AsyncIOScheduler(
            timezone=UTC,
            job_defaults={
                "coalesce": True,
                "misfire_grace_time": self._grace_seconds,
                "max_instances": MAX_JOB_INSTANCES,
            },
        )
        scheduler.add_listener(self._on_missed, EVENT_JOB_MISSED)
        scheduler.start()
        self._scheduler = scheduler
        pruned = await self._store.prune_fires()
        if pruned:
            log.info("task_history_pruned", fires=pruned)
        for stored in await self._store.active():
            task = await self._due_by_todays_rule(stored)
            try:
                self.plan(task)
            except (ValueError, OverflowError) as exc:  # stored before due times were bounded: leave it unplanned
                log.error("task_not_planned", task_id=task.id, error=str(exc))
        await self._handler.resume()
        log.info("scheduler_started", tasks=len(scheduler.get_jobs()))

    async def _due_by_todays_rule(self, task: TaskRecord) -> TaskRecord:
        """A cron task stored under an older reading of cron (both day fields had to match) can hold a next
        due time later than its expression's first one from now: it moves back to that one."""
        now = _at(self._clock())
        if task.next_due_at is None or task.next_due_at <= now.timestamp():  # due or missed: the usual path
            return task
        try:
            schedule = task_schedule(task, now)
        except ScheduleError:
            return task  # its due time pauses it with the reason
        first = schedule.next_due(None, now) if schedule.kind is ScheduleKind.CRON else None
        if first is None or first.timestamp() >= task.next_due_at:
            return task
        if not await self._store.move_due_earlier(task.id, task.next_due_at, first.timestamp()):
            return task
        log.info("task_due_moved_earlier", task_id=task.id, was=task.next_due_at, now_due=first.timestamp())
        return await self._store.get(task.id) or task

    async def stop(self) -> None:
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.shutdown(wait=False)
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)

    def plan(self, task: TaskRecord) -> None:
        """(Re)place the task's job at its next due time; an inactive task has none."""
        if self._scheduler is None:
            return
        if task.status is not TaskStatus.ACTIVE or task.next_due_at is None:
            self.unplan(task.id)
            return
        self._scheduler.add_job(
            self._due,
            trigger=DateTrigger(run_date=_at(task.next_due_at), timezone=UTC),
            args=(task.id, task.next_due_at),
            id=task.id,
            name=f"task {task.id}",
            replace_existing=True,
        )

    def unplan(self, task_id: str) -> None:
        if self._scheduler is not None:
            with contextlib.suppress(JobLookupError):
                self._scheduler.remove_job(task_id)

    def planned(self, task_id: str) -> datetime | None:
        """The time the task's job will run next (None: no job), as APScheduler holds it."""
        job = self._scheduler.get_job(task_id) if self._scheduler is not None else None
        if job is None:
            return None
        when: datetime = job.next_run_time
        return when

    def _on_missed(self, event: JobEvent) -> None:
        # APScheduler calls this in its own loop iteration: the database work goes to a task of ours.
        due: datetime = event.scheduled_run_time
        self._spawn(self._missed(event.job_id, due.timestamp()), f"missed-{event.job_id}")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _missed(self, task_id: str, due_at: float) -> None:
        """A due time more than the grace late (the bot was down) is skipped. The task moves on to its first
        due time inside the grace, which then runs at once, or else to its next one from now."""
        task = await self._store.get(task_id)
        if task is None or task.status is not TaskStatus.ACTIVE:
            return
        late = int(self._clock() - due_at)
        reason = f"missed: due {shown_time(due_at, ZoneInfo(task.timezone))}, {late}s late (the bot was not running)"
        await self._advance(task, due_at, after=_at(self._clock() - self._grace_seconds), skip=reason)

    async def _due(self, task_id: str, due_at: float) -> None:
        task = await self._store.get(task_id)
        if task is None or task.status is not TaskStatus.ACTIVE:
            return
        skip = None
        if task.backoff_until is not None and due_at < task.backoff_until:
            skip = f"backing off after {task.failures} failure(s) in a row"
        fire, task = await self._advance(task, due_at, after=None, skip=skip)
        if fire is not None and skip is None:
            # In a task of its own: a subagent waiting for a free slot must not hold the job.
            self._spawn(self._handler.run(fire, task), f"fire-{fire.id}")

    async def _advance(
        self, task: TaskRecord, due_at: float, *, after: datetime | None, skip: str | None
    ) -> tuple[Fire | None, TaskRecord]:
        """Claim `due_at` and move the task to its due time following it (or the first from `after`), then
        plan that."""
        now = _at(self._clock())
        try:
            schedule = task_schedule(task, now)
        except ScheduleError as exc:  # cannot happen for a schedule that was accepted; never loop on it
            log.error("task_schedule_unreadable", task_id=task.id, error=str(exc))
            await self._store.set_status(task.id, TaskStatus.PAUSED, f"its schedule cannot be read: {exc}")
            return None, task
        following: float | None = None
        if schedule.kind is not ScheduleKind.ONCE:
            nxt = schedule.next_due(_at(due_at), now) if after is None else schedule.next_due(None, after)
            if after is None and nxt is not None and nxt <= now:
                nxt = schedule.next_due(None, now)  # coalesce: due times that passed while this one ran are one
            following = None if nxt is None else nxt.timestamp()
        fire = await self._store.claim(task.id, due_at, following, skip=skip)
        if fire is None:
            log.info("task_due_taken", task_id=task.id, due_at=due_at)
        elif skip:
            log.info("task_due_skipped", task_id=task.id, due_at=due_at, reason=skip)
        current = await self._store.get(task.id)
        if current is not None and not (fire is None and current.next_due_at == due_at):  # never loop on one time
            self.plan(current)
        return fire, current or task
