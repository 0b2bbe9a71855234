"""What a main-agent turn's tools are given: the chat, the turn, who asked, and the services they use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bot.engine import Turn

if TYPE_CHECKING:
    from bot.schedules.book import TaskBook


class Spawner(Protocol):
    async def spawn(self, chat_id: int, turn_id: str, task: str, label: str | None, include_context: bool) -> str:
        """Write a spawn request; return its run id at once (never wait for the container)."""


@dataclass(frozen=True, slots=True)
class TurnDeps:
    chat_id: int
    turn: Turn
    spawner: Spawner
    tasks: TaskBook | None = None  # scheduled tasks, when the app runs a scheduler
    requester_id: int | None = None  # who wrote the message the turn answers: a task's creator
