"""What a main-agent turn's tools are given: the chat, the turn, who asked, and the services they use."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from bot.ports.runs import RunInfo
from bot.ports.spawner import Spawner
from bot.turns.engine import Turn
from core.store.runs import FollowUp, RunStatus

if TYPE_CHECKING:
    from bot.agent.memory import Memory
    from bot.schedules.book import TaskBook


AdminCheck = Callable[[int, int], Awaitable[bool]]  # (chat id, user id) -> an admin of that chat


class SubagentDesk(Protocol):
    """What the `subagents` tool needs of the subagent side, for the current chat's runs only."""

    async def list_runs(self, chat_id: int, limit: int) -> Sequence[RunInfo]: ...

    async def describe_run(self, chat_id: int, run_id: str) -> str | None:
        """State, age, label, tokens and its latest progress message; None: the chat has no such run."""

    async def send_to_run(self, chat_id: int, run_id: str, text: str) -> FollowUp: ...

    async def cancel_run(self, chat_id: int, run_id: str) -> RunStatus | None: ...


@dataclass(frozen=True, slots=True)
class TurnDeps:
    chat_id: int
    turn: Turn
    spawner: Spawner
    tasks: TaskBook | None = None  # scheduled tasks, when the app runs a scheduler
    requester_id: int | None = None  # who wrote the message the turn answers: a task's creator
    desk: SubagentDesk | None = None  # the `subagents` tool: this chat's runs
    # The senders of every message this turn answers (several when messages merged; None for one with no
    # user, a scheduled prompt; empty for an announcement). Admin-only tools act for all of them at once.
    askers: tuple[int | None, ...] = ()
    is_admin: AdminCheck | None = None  # None: nobody is an admin here
    memory: Memory | None = None  # notes and history search; None: not available
    asker_names: Mapping[int, str] = field(default_factory=dict)  # the askers' names, as the window shows them
    # Each asker's own newest message of this turn (messages.id): what a note they asked for cites.
    asker_messages: Mapping[int | None, int] = field(default_factory=dict)

    async def asked_by_admins(self) -> bool:
        """Whether an admin-only action may be taken for this turn: only if everyone who asked is an admin.
        Decided by who wrote the triggering messages, never by anything the model read or was told."""
        if self.is_admin is None or not self.askers:
            return False
        for sender in dict.fromkeys(self.askers):
            if sender is None or not await self.is_admin(self.chat_id, sender):
                return False
        return True
