"""Scheduled tasks assembled for the app: the store, the firing, the scheduler and the book, on one
database, with a lifetime (start rebuilds the schedule from the database; stop leaves it there)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bot.ports.spawner import Spawner
from bot.schedules.book import ScheduleLimits, TaskBook
from bot.schedules.firing import Notifier, TaskFiring
from bot.schedules.scheduler import TaskScheduler
from core.setting_questions import ApprovalMode
from core.settings import Settings
from core.store.db import Database
from core.store.messages import MessageStore, NewMessage
from core.store.schedules import ScheduleStore

SCHEDULED_KIND = "scheduled"  # a message a mode=message task puts to the main agent


class ChatPoster:
    """mode=message: the prompt is stored as a triggering message of the chat, and its turn is asked for."""

    def __init__(self, messages: MessageStore, notify: Callable[[int, int | None], None]) -> None:
        self._messages = messages
        self._notify = notify

    async def post(self, chat_id: int, sender_name: str, prompt: str) -> None:
        row_id = await self._messages.add(
            NewMessage(chat_id=chat_id, sender_name=sender_name, content=prompt, is_trigger=True, kind=SCHEDULED_KIND)
        )
        self._notify(chat_id, row_id)  # its turn's prompt ends at this message, which it answers


class Schedules:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        spawner: Spawner | None,
        poster: ChatPoster,
        notifier: Notifier,
        is_admin: Callable[[int, int], Awaitable[bool]],
        allowed: Callable[[int], Awaitable[bool]] | None = None,
        spent: Callable[[int], Awaitable[str | None]] | None = None,
    ) -> None:
        self.store = ScheduleStore(db)
        self.firing = TaskFiring(
            self.store,
            spawner,
            poster,
            notifier,
            max_failures=settings.schedule_max_failures,
            allowed=allowed,
            spent=spent,
        )
        self.scheduler = TaskScheduler(
            self.store, self.firing, misfire_grace_seconds=settings.schedule_misfire_grace_seconds
        )
        self.firing.planner = self.scheduler
        limits = ScheduleLimits(
            min_interval_seconds=settings.schedule_min_interval_seconds,
            max_tasks_per_chat=settings.max_tasks_per_chat,
            default_timezone=settings.timezone,
            admins_approve=lambda: settings.subagent_approval is ApprovalMode.ADMINS,
        )
        self.book = TaskBook(self.store, self.scheduler, limits, is_admin)

    async def start(self) -> None:
        await self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()
        await self.firing.close()
