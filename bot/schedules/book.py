"""What chats and the main agent may ask of scheduled tasks: make one (checked against the limits), list
them, pause, resume or cancel one (its creator, chat admins and ADMIN_USER_IDS), and the chat's time zone.
Every refusal is a `TaskRequestError` whose message says why, for the chat or the model to pass on."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol
from zoneinfo import ZoneInfo

from core.schedule_spec import ScheduleError, parse_schedule, shown_time
from core.settings import check_timezone
from core.store.chat_files import parse_ref
from core.store.schedules import NewTask, ScheduleStore, TaskLimitReached, TaskMode, TaskRecord, TaskStatus

MAX_PROMPT_CHARS = 8_000
MAX_TASK_FILES = 10  # as many as one run may be given
MAX_LABEL_CHARS = 60
MAX_OUTCOME_CHARS = 80
HISTORY_LINES = 10  # due times `/tasks <id>` shows
# The console is the operator alone, not a group to protect from itself: its floor is lower, so the
# offline demo's `schedule: every 2m $ date` works there with the default SCHEDULE_MIN_INTERVAL_SECONDS.
CONSOLE_MIN_INTERVAL_SECONDS = 60


class TaskAction(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"


class TaskRequestError(Exception):
    """Refused: the message says why."""


class Planner(Protocol):
    def plan(self, task: TaskRecord) -> None: ...

    def unplan(self, task_id: str) -> None: ...


AdminCheck = Callable[[int, int], Awaitable[bool]]  # (chat id, user id) -> may manage every task of the chat


@dataclass(frozen=True, slots=True)
class ScheduleLimits:
    min_interval_seconds: int
    max_tasks_per_chat: int
    default_timezone: str
    # SUBAGENT_APPROVAL=admins (read at each creation): a subagent task is approved once, by its creation, so only
    # a chat admin (or ADMIN_USER_IDS) creates one; its runs are not asked about again.
    admins_approve: Callable[[], bool] = lambda: False


def _file_refs(files: Sequence[str], mode: TaskMode) -> tuple[str, ...]:
    """The chat files each run is given, as the prompt names them; whether they are still there, and the
    chat's, is checked each time it is due (the run's task then says which were not given, and why)."""
    refs = tuple(dict.fromkeys(ref.strip() for ref in files))
    if refs and mode is not TaskMode.SUBAGENT:
        raise TaskRequestError("files go with subagent tasks only (mode subagent)")
    if len(refs) > MAX_TASK_FILES:
        raise TaskRequestError(f"a task may name at most {MAX_TASK_FILES} files")
    bad = [ref for ref in refs if parse_ref(ref) is None]
    if bad:
        raise TaskRequestError(f"{bad[0][:40]!r} is not a file id like f3 (the transcript shows them)")
    return refs


def _label(label: str | None, prompt: str) -> str:
    text = " ".join((label or prompt).split()) or "task"
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "…"


class TaskBook:
    def __init__(
        self,
        store: ScheduleStore,
        planner: Planner,
        limits: ScheduleLimits,
        is_admin: AdminCheck,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._planner = planner
        self._limits = limits
        self._is_admin = is_admin
        self._clock = clock

    async def _by_admin(self, chat_id: int, user_id: int | None) -> bool:
        return user_id is not None and await self._is_admin(chat_id, user_id)

    async def zone(self, chat_id: int) -> ZoneInfo:
        return ZoneInfo(await self._store.chat_timezone(chat_id) or self._limits.default_timezone)

    async def schedule(
        self,
        chat_id: int,
        creator_id: int | None,
        prompt: str,
        schedule: str,
        label: str | None = None,
        mode: str = TaskMode.SUBAGENT,
        files: Sequence[str] = (),
    ) -> TaskRecord:
        prompt = prompt.strip()
        if not prompt:
            raise TaskRequestError("the task needs a prompt: what to do when it is due")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise TaskRequestError(f"the prompt is longer than {MAX_PROMPT_CHARS} characters")
        try:
            task_mode = TaskMode(mode)
        except ValueError:
            raise TaskRequestError("mode must be subagent or message") from None
        refs = _file_refs(files, task_mode)
        if (
            task_mode is TaskMode.SUBAGENT
            and self._limits.admins_approve()
            and not await self._by_admin(chat_id, creator_id)
        ):
            raise TaskRequestError(
                "runs here need an admin's approval (SUBAGENT_APPROVAL=admins), so a scheduled subagent task is "
                "approved by its creation: only a chat admin can create one"
            )
        zone = await self.zone(chat_id)
        now = self._clock()
        minimum = self._limits.min_interval_seconds
        if await self._store.chat_kind(chat_id) == "console":
            minimum = min(minimum, CONSOLE_MIN_INTERVAL_SECONDS)
        try:
            # In a thread: a cron that never comes due is searched for 100 years ahead (core/cron.py).
            parsed = await asyncio.to_thread(
                functools.partial(
                    parse_schedule, schedule, zone, now=datetime.fromtimestamp(now, UTC), min_interval_seconds=minimum
                )
            )
        except ScheduleError as exc:
            raise TaskRequestError(str(exc)) from None
        first = parsed.next_due(None, datetime.fromtimestamp(now, UTC))
        if first is None:
            raise TaskRequestError(f"{schedule!r} never comes due")
        new = NewTask(
            chat_id=chat_id,
            creator_id=creator_id,
            label=_label(label, prompt),
            prompt=prompt,
            schedule=parsed.text,
            timezone=zone.key,
            mode=task_mode,
            next_due_at=first.timestamp(),
            created_at=now,
            files=refs,
        )
        try:
            task = await self._store.create(new, self._limits.max_tasks_per_chat)
        except TaskLimitReached as exc:
            raise TaskRequestError(f"{exc}: cancel one first (/tasks lists them)") from None
        self._planner.plan(task)
        return task

    def describe_new(self, task: TaskRecord) -> str:
        due = shown_time(task.next_due_at, ZoneInfo(task.timezone))
        return f"Scheduled task {task.id} ({task.label}), {self.words(task)}; next due {due}."

    def words(self, task: TaskRecord) -> str:
        try:
            return parse_schedule(
                task.schedule, ZoneInfo(task.timezone), now=datetime.now(UTC), min_interval_seconds=1, check_past=False
            ).words
        except ScheduleError:
            return task.schedule

    async def list_text(self, chat_id: int) -> str:
        tasks = await self._store.for_chat(chat_id)
        if not tasks:
            return "No scheduled tasks in this chat. Ask me for one, e.g. “every Monday at 9, summarise last week”."
        lines = ["Scheduled tasks:"]
        for task in tasks:
            zone = ZoneInfo(task.timezone)
            paused = (
                f" · PAUSED ({task.status_reason})" if task.status is TaskStatus.PAUSED and task.status_reason else ""
            )
            if task.status is TaskStatus.PAUSED and not paused:
                paused = " · PAUSED"
            outcome = (task.last_outcome or "not run yet")[:MAX_OUTCOME_CHARS]
            files = f" · files: {', '.join(task.files)}" if task.files else ""
            lines.append(
                f"`{task.id}` {task.label} · {self.words(task)} · next {shown_time(task.next_due_at, zone)}"
                f" · last: {outcome} · {task.mode}{paused}{files}"
            )
        lines.append("/tasks <id> shows one's history; /tasks pause|resume|cancel <id> changes it (creator or admin).")
        return "\n".join(lines)

    async def history_text(self, chat_id: int, task_id: str) -> str:
        """One task of this chat and its latest due times, newest first, with what became of each."""
        task = await self._store.get(task_id.strip()[:32])
        if task is None or task.chat_id != chat_id:
            raise TaskRequestError(f"no scheduled task {task_id[:32]} in this chat (/tasks lists them)")
        zone = ZoneInfo(task.timezone)
        lines = [
            f"`{task.id}` {task.label} · {self.words(task)} · {task.status} · next {shown_time(task.next_due_at, zone)}"
        ]
        for fire in await self._store.history(task.id, HISTORY_LINES):
            detail = f": {fire.detail}" if fire.detail else ""
            run = f" (run {fire.run_id})" if fire.run_id else ""
            lines.append(f"{shown_time(fire.due_at, zone)} {fire.status}{run}{detail}"[:200])
        if len(lines) == 1:
            lines.append("Not due yet.")
        return "\n".join(lines)

    async def change(
        self,
        chat_id: int,
        user_id: int | None,
        task_id: str,
        action: TaskAction,
        admin: bool,
        also_asked_by: Sequence[int | None] = (),
    ) -> str:
        """Pause, resume or cancel a task of this chat, if `admin` says so or `user_id` (and each of
        `also_asked_by`, the others in a merged request) made it or is_admin says so."""
        task = await self._store.get(task_id.strip()[:32])
        if task is None or task.chat_id != chat_id:
            raise TaskRequestError(f"no scheduled task {task_id[:32]} in this chat (/tasks lists them)")
        allowed = admin
        if not admin:
            for asker in dict.fromkeys((user_id, *also_asked_by)):
                allowed = asker is not None and (asker == task.creator_id or await self._is_admin(chat_id, asker))
                if not allowed:
                    break
        if not allowed:
            raise TaskRequestError(f"only the task's creator or a chat admin can {action} task {task.id}")
        if task.status in (TaskStatus.CANCELLED, TaskStatus.COMPLETED):
            raise TaskRequestError(f"task {task.id} has already ended ({task.status})")
        if action is TaskAction.CANCEL:
            await self._store.set_status(task.id, TaskStatus.CANCELLED, "cancelled")
            self._planner.unplan(task.id)
            return f"Cancelled scheduled task {task.id} ({task.label})."
        if action is TaskAction.PAUSE:
            if not await self._store.set_status(task.id, TaskStatus.PAUSED, "paused", only_from=(TaskStatus.ACTIVE,)):
                raise TaskRequestError(f"task {task.id} is already paused")
            self._planner.unplan(task.id)
            return f"Paused scheduled task {task.id} ({task.label})."
        return await self._resume(task)

    async def _resume(self, task: TaskRecord) -> str:
        now = datetime.fromtimestamp(self._clock(), UTC)
        parsed = parse_schedule(
            task.schedule,
            ZoneInfo(task.timezone),
            now=now,
            created_at=datetime.fromtimestamp(task.created_at, UTC),
            min_interval_seconds=1,
            check_past=False,
        )
        nxt = parsed.next_due(None, now)
        if nxt is None or nxt <= now:
            raise TaskRequestError(f"task {task.id} has no due time left (a one-off whose time has passed)")
        if not await self._store.set_status(
            task.id, TaskStatus.ACTIVE, None, only_from=(TaskStatus.PAUSED,), next_due_at=nxt.timestamp()
        ):
            raise TaskRequestError(f"task {task.id} is not paused")
        current = await self._store.get(task.id)
        if current is not None:
            self._planner.plan(current)
        due = shown_time(nxt.timestamp(), ZoneInfo(task.timezone))
        return f"Resumed scheduled task {task.id} ({task.label}); next due {due}."

    async def set_timezone(self, chat_id: int, name: str) -> str:
        try:
            zone = check_timezone(name.strip())
        except ValueError as exc:
            raise TaskRequestError(str(exc)) from None
        await self._store.set_chat_timezone(chat_id, zone)
        return f"This chat's time zone is now {zone}; new schedules are read in it (existing tasks keep theirs)."

    async def cancel_chat(self, chat_id: int, reason: str) -> int:
        for task in await self._store.for_chat(chat_id):
            self._planner.unplan(task.id)
        return await self._store.cancel_chat(chat_id, reason)
