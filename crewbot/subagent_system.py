"""What the app needs from the runner package (crewbot/serve.py builds it; crewbot/app.py runs it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from bot.agent.deps import SubagentDesk
from bot.commands import RunControl, WorkspaceControl
from bot.ports.spawner import Spawner
from core.delivery import Delivery
from core.questions import Questions
from core.typing_indicator import TypingIndicator


class SubagentSystem(Protocol):
    """What the host needs from the runner package: a spawner, run control, and a lifetime."""

    @property
    def spawner(self) -> Spawner: ...

    @property
    def control(self) -> RunControl: ...

    @property
    def workspaces(self) -> WorkspaceControl: ...

    @property
    def desk(self) -> SubagentDesk:
        """The main agent's `subagents` tool: list, status, send, cancel."""

    @property
    def questions(self) -> Questions:
        """The desk of questions to the chat its runs ask (ask_chat, web hosts, approvals)."""

    def watch_runs(self, on_change: Callable[[str], None]) -> None:
        """Call `on_change(run_id)` whenever a run's state changes (the status card)."""

    async def wait_ended(self, chat_id: int) -> None:
        """Until the chat's runs whose result is in the chat have ended, their containers gone."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


SubagentFactory = Callable[[Delivery, TypingIndicator], SubagentSystem]
