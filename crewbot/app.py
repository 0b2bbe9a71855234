"""Builds every object once, in one place, and wires them together; runs and stops them in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pydantic_ai.models import Model

from bot.agent.llm import build_main_model
from bot.agent.main_agent import MainAgent, Spawner
from bot.channels.base import Channel
from bot.commands import Commands, RunControl, WorkspaceControl
from bot.engine import ChatEngine, Turn
from bot.flood import FloodGuard
from bot.router import InboundRouter
from core.delivery import Delivery
from core.live_config import LiveConfig
from core.logging import get_logger
from core.outbox import Outbox
from core.settings import CancelScope, LLMProvider, Settings
from core.store.stores import Stores
from core.store.turns import TurnStatus, TurnStore
from core.typing_indicator import TypingIndicator

log = get_logger(__name__)


SubagentFactory = Callable[["Delivery", "TypingIndicator"], "SubagentSystem"]


class SubagentSystem(Protocol):
    """What the host needs from the runner package: a spawner, run control, and a lifetime."""

    @property
    def spawner(self) -> Spawner: ...

    @property
    def control(self) -> RunControl: ...

    @property
    def workspaces(self) -> WorkspaceControl: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class TurnRecorder:
    """The engine's TurnLifecycle: turns in the store, and the cascading cancel of an aborted turn."""

    def __init__(self, turns: TurnStore, scope: CancelScope, runs: RunControl | None) -> None:
        self._turns = turns
        self._scope = scope
        self.runs = runs

    async def turn_started(self, turn: Turn) -> None:
        await self._turns.start(turn.id, turn.chat_id)

    async def turn_ended(self, turn: Turn, status: TurnStatus) -> None:
        await self._turns.end(turn.id, status)

    async def turn_aborted(self, turn: Turn, reason: str) -> None:
        # Mark the turn first: a spawn request of this turn that is picked up later sees it and never starts.
        await self._turns.end(turn.id, TurnStatus.ABORTED)
        if self.runs is None:
            return
        try:
            if self._scope is CancelScope.CHAT or reason == "stop":
                cancelled = await self.runs.cancel_chat(turn.chat_id, f"turn {turn.id} aborted ({reason})")
            else:
                cancelled = await self.runs.cancel_turn(turn.id, f"turn aborted ({reason})")
        except Exception:
            log.exception("cascade_cancel_failed", turn_id=turn.id)
            return
        log.info("turn_aborted", turn_id=turn.id, chat_id=turn.chat_id, reason=reason, runs_cancelled=cancelled)


class App:
    def __init__(
        self,
        settings: Settings,
        channel: Channel,
        stores: Stores,
        subagent_factory: SubagentFactory | None = None,
        model: Model | None = None,
        config: LiveConfig | None = None,
    ) -> None:
        self.settings = settings
        self.channel = channel
        self.stores = stores
        self.typing = TypingIndicator(channel.send_typing, settings.typing_interval_seconds)
        self.outbox = Outbox(stores.outbox, channel)
        self.delivery = Delivery(stores.outbox, self.outbox, settings.assistant_name)
        subagents = subagent_factory(self.delivery, self.typing) if subagent_factory else None
        self.subagents = subagents
        self.agent = MainAgent(
            model or build_main_model(settings),
            stores.messages,
            self.delivery,
            subagents.spawner if subagents else None,
            assistant_name=settings.assistant_name,
            history_window=settings.history_window_messages,
            timeout_seconds=settings.llm_timeout_seconds,
        )
        control = subagents.control if subagents else None
        self.recorder = TurnRecorder(stores.turns, settings.merge_cancel_scope, control)
        self.engine = ChatEngine(self.agent, self.recorder, self.typing, settings.merge_window_seconds)
        self.commands = Commands(
            channel,
            self.delivery,
            self.engine,
            control,
            settings.admin_user_ids,
            workspaces=subagents.workspaces if subagents else None,
            config=config,
        )
        self.router = InboundRouter(
            settings,
            chats=stores.chats,
            messages=stores.messages,
            engine=self.engine,
            commands=self.commands,
            delivery=self.delivery,
            flood=FloodGuard(),
        )

    async def start(self) -> None:
        if self.settings.llm_provider is LLMProvider.OFFLINE:
            log.warning(
                "offline_model",
                message="no real LLM is configured (LLM_PROVIDER=offline): answers come from the offline demo model",
            )
        interrupted = await self.stores.turns.close_interrupted()
        if interrupted:
            log.info("turns_interrupted_by_restart", count=interrupted)
        # The channel first: re-attached runs show typing at once. Spawn requests that new turns write
        # meanwhile wait in their folders until recovery is done and the watcher starts.
        await self.channel.start(self.router.handle)
        if self.subagents is not None:
            await self.subagents.start()
        self.outbox.start()  # also sends whatever a crash left owed
        log.info("crewbot_started", channel=self.channel.name, provider=self.settings.llm_provider.value)

    async def wait_quiet(self, chat_id: int) -> None:
        """Until the chat has no turn and no subagent: both hold its typing indicator while they run."""
        await self.typing.wait_idle(chat_id)

    async def stop(self) -> None:
        """Stop taking work, finish writing, leave containers running for the next start to re-attach."""
        await self.channel.stop_receiving()
        await self.engine.close()
        if self.subagents is not None:
            await self.subagents.stop()
        await self.typing.close()
        await self.outbox.close()
        await self.channel.stop()
        await self.stores.db.close()
        log.info("crewbot_stopped")
