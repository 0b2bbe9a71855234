"""A scheduled-task rig on a real SQLite file and the real APScheduler; the spawner and the chat are the
edges, recorded (the runner side and Telegram are tested on their own and end to end elsewhere)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bot.ports.spawner import SpawnRefused
from bot.schedules.book import ScheduleLimits, TaskBook
from bot.schedules.firing import TaskFiring
from bot.schedules.scheduler import TaskScheduler
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.schedules import Fire, FireStatus, ScheduleStore

CHAT = -900
CREATOR = 11
CRON_WAIT_SECONDS = 90.0  # the next minute boundary is up to 60 s away
WAIT_SECONDS = 30.0  # a bound on waits for things that happen in about a second; never a timing claim


@dataclass
class Spawned:
    chat_id: int
    task: str
    label: str | None
    at: float  # wall-clock seconds when the spawn was asked for
    files: tuple[str, ...] = ()


@dataclass
class RecordingSpawner:
    """Records spawns; `refuse` full-cap refusals come first, `fail` makes every spawn raise."""

    refuse: int = 0
    fail: str | None = None
    spawned: list[Spawned] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def spawn(
        self,
        chat_id: int,
        turn_id: str,
        task: str,
        label: str | None,
        include_context: bool,
        files: Sequence[str] = (),
    ) -> str:
        if self.refuse:
            self.refuse -= 1
            raise SpawnRefused("this chat's limit of 1 subagent run at once is reached")
        if self.fail:
            raise RuntimeError(self.fail)
        async with self.changed:
            self.spawned.append(Spawned(chat_id, task, label, time.time(), tuple(files)))
            self.changed.notify_all()
        return f"run{len(self.spawned)}"

    async def wait_for(self, count: int, timeout_seconds: float = WAIT_SECONDS) -> list[Spawned]:
        async with asyncio.timeout(timeout_seconds), self.changed:
            await self.changed.wait_for(lambda: len(self.spawned) >= count)
        return self.spawned


@dataclass
class RecordingChat:
    """The chat's side: notices sent and prompts posted to the main agent."""

    notices: list[str] = field(default_factory=list)
    posted: list[tuple[str, str]] = field(default_factory=list)

    async def notice(self, chat_id: int, content: str, *, wait: bool = False) -> bool:
        self.notices.append(content)
        return True

    async def post(self, chat_id: int, sender_name: str, prompt: str) -> None:
        self.posted.append((sender_name, prompt))


@dataclass
class Rig:
    db: Database
    store: ScheduleStore
    scheduler: TaskScheduler
    firing: TaskFiring
    book: TaskBook
    spawner: RecordingSpawner
    chat: RecordingChat

    async def settled_history(self, task_id: str) -> list[Fire]:
        """The task's fires once none is between being taken and noting its run (a moment's DB write)."""
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                history = await self.store.history(task_id)
                if not any(f.status in (FireStatus.CLAIMED, FireStatus.STARTING) for f in history):
                    return history
                await asyncio.sleep(0.02)

    async def stop(self) -> None:
        await self.scheduler.stop()
        await self.firing.close()
        await self.db.close()


async def _deny(chat_id: int, user_id: int) -> bool:
    return False


async def open_rig(
    path: Path,
    *,
    spawner: RecordingSpawner | None = None,
    grace_seconds: int = 300,
    min_interval_seconds: int = 1,
    max_tasks: int = 20,
    max_failures: int = 5,
    clock: Callable[[], float] = time.time,
    start: bool = True,
) -> Rig:
    db = await Database.open(path)
    await ChatStore(db).ensure(CHAT, "group", "scheduled")
    store = ScheduleStore(db)
    spawner = spawner or RecordingSpawner()
    chat = RecordingChat()
    firing = TaskFiring(
        store,
        spawner,
        chat,
        chat,
        max_failures=max_failures,
        clock=clock,
        wait_retry_seconds=0.05,
        settle_poll_seconds=0.05,
    )
    scheduler = TaskScheduler(store, firing, misfire_grace_seconds=grace_seconds, clock=clock)
    firing.planner = scheduler
    limits = ScheduleLimits(min_interval_seconds, max_tasks, "UTC")
    book = TaskBook(store, scheduler, limits, _deny, clock=clock)
    if start:
        await scheduler.start()
    return Rig(db, store, scheduler, firing, book, spawner, chat)
