"""What a main-agent turn's tools are given: the chat, the turn, and the subagent side's two faces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bot.commands import RunInfo
from bot.engine import Turn
from core.store.runs import FollowUp, RunStatus


class Spawner(Protocol):
    async def spawn(self, chat_id: int, turn_id: str, task: str, label: str | None, include_context: bool) -> str:
        """Write a spawn request; return its run id at once (never wait for the container)."""


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
    desk: SubagentDesk | None = None
