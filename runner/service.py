"""Assembles the subagent system (runtime, LLM proxy, task manager, IPC watcher) for the host app."""

from __future__ import annotations

import asyncio
import contextlib

from bot.app import Stores
from bot.commands import RunControl
from bot.delivery import Delivery
from bot.logging import get_logger
from bot.settings import Settings
from bot.store.runs import RunStore
from bot.typing_indicator import TypingIndicator
from container.protocol import ProgressMessage
from runner.docker_runtime import DockerRuntime
from runner.ipc import ensure_ipc_root
from runner.ipc_outcome import RequestOutcome
from runner.live_runs import LiveRuns
from runner.llm_proxy import LlmProxy, UpstreamConfig
from runner.manager import SUBAGENT_SENDER, TaskManager
from runner.paths import DataPaths
from runner.recovery import Recovery
from runner.runtime import ContainerRuntime, RuntimeUnavailable
from runner.spawner import IpcSpawner
from runner.watcher import IpcWatcher

log = get_logger(__name__)

RECOVERY_RETRY_SECONDS = 30.0  # how often to retry reconciling while the engine is down at start


class SubagentService:
    def __init__(
        self,
        settings: Settings,
        stores: Stores,
        delivery: Delivery,
        typing: TypingIndicator,
        runtime: ContainerRuntime,
    ) -> None:
        self._settings = settings
        self._stores = stores
        self._delivery = delivery
        self._runtime = runtime
        self.paths = DataPaths(settings.data_dir)
        self.runs = RunStore(stores.db)
        self._spawner = IpcSpawner(self.paths.ipc_root, stores.chats)
        self.live = LiveRuns()
        self.proxy = LlmProxy(UpstreamConfig.from_settings(settings), self.live, self.runs)
        self.manager = TaskManager(
            settings,
            runs=self.runs,
            chats=stores.chats,
            messages=stores.messages,
            turns=stores.turns,
            runtime=runtime,
            live=self.live,
            llm=self.proxy,
            delivery=delivery,
            typing=typing,
            paths=self.paths,
        )
        self.watcher = IpcWatcher(
            self.paths.ipc_root,
            self._resolve_folder,
            self.manager.on_request,
            self._on_message,
            rescan_interval_seconds=settings.ipc_rescan_seconds,
            force_polling=settings.ipc_force_polling,
            max_file_bytes=settings.ipc_max_file_bytes,
        )
        self.recovery = Recovery(self.runs, runtime, self.manager, self.paths)
        self._watch_task: asyncio.Task[None] | None = None
        self._recovery_task: asyncio.Task[None] | None = None

    @property
    def spawner(self) -> IpcSpawner:
        return self._spawner

    @property
    def control(self) -> RunControl:
        return self.manager

    async def _resolve_folder(self, folder: str) -> int | None:
        """A folder speaks for its chat only while that chat is known and allowed."""
        chat = await self._stores.chats.by_folder(folder)
        if chat is None:
            return None
        if chat.kind != "console" and not self._settings.chat_allowed(chat.id):
            return None
        return chat.id

    async def _on_message(self, chat_id: int, message: ProgressMessage) -> RequestOutcome:
        if not await self.runs.remember_ipc_message(message.message_id, chat_id):
            return RequestOutcome.DUPLICATE
        if message.run_id is not None and not self.live.is_live(message.run_id):
            log.info("progress_message_dropped", chat_id=chat_id, run_id=message.run_id, reason="run not live")
            return RequestOutcome.ACCEPTED
        await self._delivery.post(chat_id, message.text, kind="progress", sender_name=SUBAGENT_SENDER, wait=False)
        return RequestOutcome.ACCEPTED

    async def start(self) -> None:
        """Reconcile with the engine before taking new work, then watch the IPC folders."""
        await asyncio.to_thread(ensure_ipc_root, self.paths.ipc_root)
        if not await self._recover():
            # The engine is down: keep answering chats, and reconcile as soon as it is back.
            self._recovery_task = asyncio.create_task(self._recover_when_engine_returns(), name="recovery")
        self._watch_task = asyncio.create_task(self.watcher.run(), name="ipc-watcher")
        await self.watcher.ready.wait()

    async def _recover(self) -> bool:
        try:
            await self.recovery.run()
        except RuntimeUnavailable as exc:
            log.error("docker_unavailable_at_start", error=str(exc))
            return False
        return True

    async def _recover_when_engine_returns(self) -> None:
        while True:  # a retry with a fixed pause: the engine gives no event when it comes back
            await asyncio.sleep(RECOVERY_RETRY_SECONDS)
            if await self._recover():
                return

    async def stop(self) -> None:
        if self._recovery_task is not None:
            self._recovery_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recovery_task
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        await self.manager.close()
        await self.proxy.close()
        await self._runtime.close()


def build_subagent_system(
    settings: Settings, stores: Stores, delivery: Delivery, typing: TypingIndicator
) -> SubagentService:
    runtime = DockerRuntime(max_concurrency=settings.max_concurrent_subagents)
    return SubagentService(settings, stores, delivery, typing, runtime)
