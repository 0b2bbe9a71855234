"""What a claimed due time does: start a subagent through the main agent's spawner (so the caps, budgets,
typing, cancel and the [Subagent] result apply), or put the prompt to the main agent; then count the
outcome: failures in a row back the task off, and pause it at SCHEDULE_MAX_FAILURES with a word to the chat.
A due time met with the chat's or the bot's daily allowance used up is skipped with that reason: no failure,
no backoff (the allowance, not the task, is at fault, and the next due time after the reset runs as usual).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from bot.ports.spawner import AllowanceRefused, Spawner, SpawnRefused
from core.backoff import backoff_seconds
from core.logging import get_logger
from core.store.schedules import PENDING_FIRES, Fire, FireStatus, ScheduleStore, TaskMode, TaskRecord, TaskStatus
from core.store.spend import SCHEDULED_TURN_PREFIX

log = get_logger(__name__)

WAIT_RETRY_SECONDS = 5.0  # a due task over the subagent caps tries again this often until a slot is free
SETTLE_POLL_SECONDS = 2.0  # how often finished runs of scheduled tasks are looked up (one indexed query)
BACKOFF_BASE_SECONDS = 60.0  # after the n-th failure in a row, due times within base * 2^(n-1) are skipped
BACKOFF_MAX_SECONDS = 86_400.0
# The turn id of a scheduled spawn (no main-agent turn stands behind it); the spend counts its runs' calls
# as scheduled by it.
TASK_TURN_PREFIX = SCHEDULED_TURN_PREFIX
_FAILED_RUNS = frozenset({"failed", "timed_out"})
_NOT_RUN = frozenset({"cancelled", "interrupted"})


class PromptPoster(Protocol):
    """mode=message: the prompt goes to the main agent as a message of the chat, and it answers."""

    async def post(self, chat_id: int, sender_name: str, prompt: str) -> None: ...


class Notifier(Protocol):
    async def notice(self, chat_id: int, content: str, *, wait: bool = False) -> bool: ...


class Unplanner(Protocol):
    def unplan(self, task_id: str) -> None: ...


class TaskFiring:
    def __init__(
        self,
        store: ScheduleStore,
        spawner: Spawner | None,
        poster: PromptPoster,
        notifier: Notifier,
        *,
        max_failures: int,
        allowed: Callable[[int], Awaitable[bool]] | None = None,
        spent: Callable[[int], Awaitable[str | None]] | None = None,
        clock: Callable[[], float] = time.time,
        wait_retry_seconds: float = WAIT_RETRY_SECONDS,
        settle_poll_seconds: float = SETTLE_POLL_SECONDS,
    ) -> None:
        self._store = store
        self._spawner = spawner
        self._poster = poster
        self._notifier = notifier
        self._max_failures = max_failures
        self._allowed = allowed  # a chat taken off ALLOWED_CHAT_IDS gets no scheduled turns or runs
        self._spent = spent  # why nothing is left of the chat's allowance today (None: something is)
        self._clock = clock
        self._wait_retry_seconds = wait_retry_seconds
        self._settle_poll_seconds = settle_poll_seconds
        self._tasks: set[asyncio.Task[None]] = set()
        self.planner: Unplanner | None = None  # set by the scheduler's owner: a paused task loses its job

    def _background(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def resume(self) -> None:
        """Due times claimed before a restart: one caught between taking and starting may have started its
        run, so it counts as interrupted (a due time runs at most once); waiting ones carry on waiting."""
        for fire in await self._store.fires(FireStatus.STARTING):
            await self._store.move_fire(
                fire.id, FireStatus.INTERRUPTED, only_from=(FireStatus.STARTING,), detail="the bot stopped"
            )
        for fire in await self._store.fires(*PENDING_FIRES):
            task = await self._store.get(fire.task_id)
            if task is not None:
                self._background(self.run(fire, task), f"fire-{fire.id}")
        self._background(self._settle_forever(), "task-settle")

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def run(self, fire: Fire, task: TaskRecord) -> None:
        if self._allowed is not None and not await self._allowed(task.chat_id):
            await self._store.move_fire(
                fire.id, FireStatus.SKIPPED, only_from=PENDING_FIRES, detail="the chat is not in ALLOWED_CHAT_IDS"
            )
            log.info("task_fire_skipped", task_id=task.id, reason="chat not allowed")
            return
        reason = await self._spent(task.chat_id) if self._spent is not None else None
        if reason is not None:
            await self._skip_spent(fire, task, PENDING_FIRES, reason)
            return
        if task.mode is TaskMode.MESSAGE:
            await self._post(fire, task)
            return
        while True:
            if not await self._store.move_fire(fire.id, FireStatus.STARTING, only_from=PENDING_FIRES):
                return  # another process took it
            try:
                await self._spawn(fire, task)
                return
            except AllowanceRefused as exc:  # does not pass in seconds: skipped, neither waiting nor failed
                await self._skip_spent(fire, task, (FireStatus.STARTING,), str(exc))
                return
            except SpawnRefused as exc:
                await self._store.move_fire(
                    fire.id, FireStatus.WAITING, only_from=(FireStatus.STARTING,), detail=f"waiting: {exc}"
                )
                log.info("task_waits_for_slot", task_id=task.id, fire_id=fire.id)
            await asyncio.sleep(self._wait_retry_seconds)
            current = await self._store.get(task.id)
            if current is None or current.status is TaskStatus.CANCELLED:
                await self._store.move_fire(fire.id, FireStatus.SKIPPED, only_from=PENDING_FIRES, detail="cancelled")
                return

    async def _skip_spent(self, fire: Fire, task: TaskRecord, only_from: tuple[FireStatus, ...], reason: str) -> None:
        await self._store.move_fire(fire.id, FireStatus.SKIPPED, only_from=only_from, detail=reason[:300])
        log.info("task_fire_skipped", task_id=task.id, fire_id=fire.id, reason="allowance used up")

    async def _spawn(self, fire: Fire, task: TaskRecord) -> None:
        if self._spawner is None:
            await self._failed(fire, task, "subagents are not available in this process")
            return
        try:
            run_id = await self._spawner.spawn(
                task.chat_id, TASK_TURN_PREFIX + task.id, task.prompt, task.label, False, task.files
            )
        except SpawnRefused:
            raise
        except Exception as exc:
            await self._failed(fire, task, f"could not start: {exc}")
            return
        await self._store.move_fire(fire.id, FireStatus.RUNNING, only_from=(FireStatus.STARTING,), run_id=run_id)
        log.info("task_fired", task_id=task.id, run_id=run_id)

    async def _post(self, fire: Fire, task: TaskRecord) -> None:
        if not await self._store.move_fire(fire.id, FireStatus.STARTING, only_from=PENDING_FIRES):
            return
        try:
            await self._poster.post(task.chat_id, f"[Scheduled task {task.id}]", task.prompt)
        except Exception as exc:
            await self._failed(fire, task, f"could not post: {exc}")
            return
        await self._store.move_fire(fire.id, FireStatus.DONE, only_from=(FireStatus.STARTING,))
        await self._store.record_outcome(task.id, failed=False)
        log.info("task_fired", task_id=task.id, mode="message")

    async def _failed(self, fire: Fire, task: TaskRecord, why: str) -> None:
        if await self._store.move_fire(
            fire.id, FireStatus.FAILED, only_from=(FireStatus.STARTING, FireStatus.RUNNING), detail=why[:300]
        ):
            await self._count_failure(task, why)

    async def _count_failure(self, task: TaskRecord, why: str) -> None:
        failures = await self._store.record_outcome(task.id, failed=True)
        delay = backoff_seconds(failures, first_seconds=BACKOFF_BASE_SECONDS, max_seconds=BACKOFF_MAX_SECONDS)
        await self._store.set_backoff(task.id, self._clock() + delay)
        log.info("task_failed", task_id=task.id, failures=failures, error=why[:200])
        if failures < self._max_failures:
            return
        reason = f"paused after {failures} failures in a row (last: {why[:200]})"
        if await self._store.set_status(task.id, TaskStatus.PAUSED, reason, only_from=(TaskStatus.ACTIVE,)):
            if self.planner is not None:
                self.planner.unplan(task.id)
            await self._notifier.notice(
                task.chat_id,
                f"Scheduled task {task.id} ({task.label}) is {reason}. /tasks resume {task.id} starts it again.",
            )

    async def settle(self) -> int:
        """Record the outcome of scheduled runs that have ended; how many were settled."""
        settled = 0
        for fire, run_status, error in await self._store.finished_runs():
            task = await self._store.get(fire.task_id)
            if task is None:
                continue
            if run_status == "rejected":  # the manager found the caps full after all: wait for a slot
                if await self._store.move_fire(fire.id, FireStatus.WAITING, only_from=(FireStatus.RUNNING,)):
                    self._background(self._rerun(fire, task), f"fire-{fire.id}")
                continue
            if run_status in _FAILED_RUNS:
                await self._failed(fire, task, error or run_status)
            elif run_status in _NOT_RUN:
                await self._store.move_fire(
                    fire.id, FireStatus.INTERRUPTED, only_from=(FireStatus.RUNNING,), detail=f"run {run_status}"
                )
            elif await self._store.move_fire(fire.id, FireStatus.DONE, only_from=(FireStatus.RUNNING,)):
                await self._store.record_outcome(task.id, failed=False)
            settled += 1
        return settled

    async def _rerun(self, fire: Fire, task: TaskRecord) -> None:
        await asyncio.sleep(self._wait_retry_seconds)
        await self.run(fire, task)

    async def _settle_forever(self) -> None:
        while True:
            try:
                await self.settle()
            except Exception:  # a locked or busy database now is no reason to stop settling later
                log.exception("task_settle_failed")
            await asyncio.sleep(self._settle_poll_seconds)
