"""Assembles the subagent system (runtime, run channels, task manager, IPC watcher, retention) for the app."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable

from core.allowances import Allowances
from core.delivery import Delivery
from core.logging import get_logger
from core.mcp_servers import McpServers
from core.questions import Questions
from core.setting_runtime import RuntimeKind
from core.settings import MAX_SUBAGENTS_CEILING, MAX_WARM_POOL, Settings
from core.store.chat_files import ChatFileStore
from core.store.egress import EgressStore
from core.store.questions import QuestionStore
from core.store.run_files import RunFileStore
from core.store.runs import FollowUp, RunStatus, RunStore
from core.stores import Stores
from core.typing_indicator import TypingIndicator
from runner.channel.llm_allowance import ProxyAllowance
from runner.channel.llm_policy import RequestPolicy
from runner.channel.llm_proxy import LlmProxy, UpstreamConfig
from runner.ipc.requests import ensure_ipc_root
from runner.ipc.spawner import IpcSpawner
from runner.ipc.watcher import IpcWatcher
from runner.lifecycle.admission import Admission
from runner.lifecycle.egress_log import EgressLog
from runner.lifecycle.manager import TaskManager
from runner.lifecycle.manager_ports import RunStores
from runner.lifecycle.metrics import RunMetrics
from runner.lifecycle.pool_folders import sweep_leftovers
from runner.lifecycle.pool_status import status_file, write_status
from runner.lifecycle.recovery import Recovery
from runner.lifecycle.run_accounting import RunAccounting
from runner.lifecycle.run_container import RunContainers
from runner.lifecycle.run_doors import RunDoors
from runner.lifecycle.warm_pool import WarmPool
from runner.runs.file_source import FileSource
from runner.runs.live_runs import LiveRuns
from runner.runtimes.docker_runtime import DockerRuntime
from runner.runtimes.runtime import ContainerRuntime, RuntimeUnavailable
from runner.storage.chat_file_cache import ChatFileCache
from runner.storage.paths import DataPaths
from runner.storage.retention import Retention
from runner.storage.run_files import ChatNotes, RunFiles
from runner.storage.run_inputs import RunInputsBuilder
from runner.storage.workspace_archive import WorkspaceArchives
from runner.storage.workspace_placement import WorkspacePlacements
from runner.storage.workspaces import Workspaces

log = get_logger(__name__)

MAX_FOLLOWUPS = 10  # follow-ups one run can be sent: each goes into every later LLM request of it
MAX_FOLLOWUP_CHARS = 2_000
RECOVERY_RETRY_SECONDS = 30.0  # how often to retry reconciling while the engine is down at start
RETENTION_INTERVAL_SECONDS = 6 * 3600.0  # pruning runs at start and then this often


class SubagentService:
    def __init__(
        self,
        settings: Settings,
        stores: Stores,
        delivery: Delivery,
        typing: TypingIndicator,
        runtime: ContainerRuntime,
        metrics: RunMetrics | None = None,
        file_source: FileSource | None = None,
        *,
        allowances: Allowances | None = None,
        chat_notes: ChatNotes | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        self._settings = settings
        self._allowances = allowances  # the daily allowances every subagent call reserves against
        self._stores = stores
        self._delivery = delivery
        self._runtime = runtime
        self.paths = DataPaths(settings.data_dir)
        self.runs = RunStore(stores.db)
        self.run_files = RunFileStore(stores.db)
        # Questions to the chat (ask_chat, the door in ask mode, approvals): the chat side answers them.
        self.questions = Questions(QuestionStore(stores.db), on_run_changed=self.runs.changed)
        self._spawner = IpcSpawner(self.paths.ipc_root, stores.chats)
        self.live = LiveRuns()
        self.metrics = metrics or RunMetrics()
        self.metrics.watch(
            running=self.live.running,
            # Accepted but not started: those about to start, and those waiting for a slot in the queue.
            queued=lambda: self.live.queued() + self.queued_count(),
            max_concurrent=lambda: settings.max_concurrent_subagents,
            max_per_chat=lambda: settings.max_subagents_per_chat,
        )
        if allowances is not None:
            self.metrics.watch_allowance(used=allowances.bot_used, allowance=lambda: settings.daily_tokens)
        accounting = RunAccounting(self.runs, self.metrics)
        self.egress = EgressStore(stores.db)
        self.egress_log = EgressLog(self.egress, self.metrics, on_written=self.runs.changed)
        # Containers (Docker) or pods (Kubernetes: runner/kube/kube_runtime.py) kept ready: read at start.
        pooled = settings.subagent_warm_pool > 0
        self.pool = (
            WarmPool(
                settings,
                runtime,
                self.paths,
                image_id=getattr(runtime, "image_id", None),
                publish=functools.partial(write_status, status_file(settings.data_dir)),
            )
            if pooled
            else None
        )
        if self.pool is not None:
            self.metrics.watch_pool(self.pool.counts, lambda: settings.subagent_warm_pool)
        # Chats' archives exist on both runtimes whatever the pool's setting: a chat is archived once a run pushed
        # its workspace, and its runs sync from then on (runner/storage/workspace_placement.py says the rule).
        self.archives = WorkspaceArchives(self.paths, lambda: settings.workspace_quota_mb)
        self.placements = WorkspacePlacements(
            self.paths, self.archives, always_synced=settings.subagent_runtime == RuntimeKind.KUBERNETES
        )
        self.workspaces = Workspaces(
            self.paths, stores.chats, self.live, settings.workspace_quota_mb, placements=self.placements
        )
        policy = RequestPolicy(
            provider=settings.llm_provider,
            model=settings.effective_subagent_model or "offline-subagent",
            allow_provider_tools=settings.subagent_allow_provider_tools,
        )
        self.proxy = LlmProxy(
            UpstreamConfig.from_settings(settings),
            self.live,
            accounting,  # the usage sink: tokens into the run's record and the metrics
            policy=policy,
            max_tokens_per_run=settings.subagent_max_tokens,
            on_budget_exhausted=self._budget_exhausted,
            allowance=ProxyAllowance(allowances, counter=self.metrics, on_spent=self._allowance_spent),
        )
        self.manager = TaskManager(
            settings,
            stores=RunStores(
                runs=self.runs,
                chats=stores.chats,
                messages=stores.messages,
                files=self.run_files,
                questions=self.questions,
            ),
            admission=Admission(settings, turns=stores.turns, live=self.live),
            runtime=runtime,
            live=self.live,
            channels=self.proxy,
            delivery=delivery,
            typing=typing,
            paths=self.paths,
            files=RunFiles(settings, self.paths, chat_notes),  # a run's notes are read as it is handed its task
            workspaces=self.workspaces,
            accounting=accounting,
            doors=RunDoors(settings, self.egress_log, self.questions, self.runs),
            mcp=mcp,  # the operator's MCP tools offered to subagents, called here on their behalf
            containers=RunContainers(
                settings, runtime, self.paths, self.runs, pool=self.pool, placements=self.placements
            ),
            inputs=RunInputsBuilder(
                settings,
                ChatFileStore(stores.db),
                ChatFileCache(self.paths.files_in_dir, file_source),
                stores.transcripts,
            ),
        )
        self.watcher = IpcWatcher(
            self.paths.ipc_root,
            self._resolve_folder,
            self.manager.on_request,
            rescan_interval_seconds=settings.ipc_rescan_seconds,
            force_polling=settings.ipc_force_polling,
            max_file_bytes=settings.ipc_max_file_bytes,
        )
        self.recovery = Recovery(
            self.runs,
            runtime,
            manager=self.manager,
            live=self.live,
            paths=self.paths,
            chats=stores.chats,
            placements=self.placements,
        )
        self.retention = Retention(stores.db, self.paths, settings.data_retention_days)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def runtime(self) -> ContainerRuntime:
        return self._runtime

    @property
    def spawner(self) -> IpcSpawner:
        return self._spawner

    @property
    def control(self) -> TaskManager:
        return self.manager

    async def picked_up(self, run_id: str) -> bool:
        """Whether the manager has taken a spawn request: it holds the run's slot a moment before the run's
        row is written, so a request in that window must not count as still waiting as well."""
        return run_id in self.live or await self.runs.exists(run_id)

    def send_to_run(self, chat_id: int, run_id: str, text: str) -> FollowUp:
        """A follow-up for a live run of the chat: the LLM proxy adds it to the run's next requests."""
        live = self.live.get(run_id)
        # A run whose result is in the chat already takes nothing more, though its container may still be exiting.
        if live is None or live.chat_id != chat_id or live.result_recorded or not self.live.is_live(run_id):
            return FollowUp.NOT_RUNNING
        if len(live.followups) >= MAX_FOLLOWUPS:
            return FollowUp.FULL
        live.followups.append(text[:MAX_FOLLOWUP_CHARS])
        log.info("run_followup", run_id=run_id, chars=len(text))
        return FollowUp.SENT

    async def wait_ended(self, chat_id: int) -> None:
        """Until the chat's runs whose result is in the chat have ended (containers gone, logs and figures
        kept): they no longer hold its typing, but may still be exiting. A cancelled run is not waited for:
        its container is stopped for sure, however long the engine is away."""
        tasks = [r.task for r in self.live.all() if r.chat_id == chat_id and r.result_recorded and r.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    def watch_runs(self, on_change: Callable[[str], None]) -> None:
        self.runs.watch(on_change)

    def queued_count(self) -> int:
        """Spawn requests waiting in the queue for a slot (the spawn guard counts them)."""
        return len(self.manager.waiting)

    async def _budget_exhausted(self, run_id: str) -> None:
        await self.manager.on_budget_exhausted(run_id)

    def _allowance_spent(self, run_id: str, reason: str) -> None:
        self.manager.on_allowance_spent(run_id, reason)

    async def _resolve_folder(self, folder: str) -> int | None:
        """A folder speaks for its chat only while that chat is known and allowed."""
        chat = await self._stores.chats.by_folder(folder)
        if chat is None:
            return None
        # A topic or an upgraded group is allowed by any of its ids, as the router allows its messages.
        return chat.id if await self._stores.chats.allowed(chat.id, self._settings.chat_allowed) else None

    async def start(self) -> None:
        """Reconcile with the engine before taking new work, then watch the IPC folders."""
        await asyncio.to_thread(ensure_ipc_root, self.paths.ipc_root)
        await self.archives.sweep_partial()  # uploads a previous process left unfinished
        if self._allowances is not None:
            await self._allowances.load()  # today's use so far, for the gauges, before the first call
        self.egress_log.start()
        # Runs an earlier process left live count against the caps (and can be cancelled) even while
        # the engine is down and recovery has to wait for it.
        for record in await self.runs.with_status(RunStatus.RUNNING):
            self.live.hold(record.id, record.chat_id, record.turn_id, record.label)
        # Queued runs (waiting for a slot, or about to start) never had a container: they wait in the
        # queue again, in their order, and start as slots free once recovery has run.
        queued = await self.runs.with_status(RunStatus.QUEUED)
        held = await self.manager.approvals.unapproved(queued)  # awaiting an admin's approval: not in the queue
        self.manager.waiting.restore([record for record in queued if record.id not in held])
        await self.manager.approvals.restore(queued)
        await self.manager.tell_unnotified_rejections()
        if not await self._recover():
            # The engine is down: keep answering chats, and reconcile as soon as it is back.
            self._tasks.append(asyncio.create_task(self._recover_when_engine_returns(), name="recovery"))
        self._tasks.append(asyncio.create_task(self.watcher.run(), name="ipc-watcher"))
        self._tasks.append(
            asyncio.create_task(self.retention.run_forever(RETENTION_INTERVAL_SECONDS), name="retention")
        )
        await self.watcher.ready.wait()

    async def _recover(self) -> bool:
        try:
            await self.recovery.run()
        except RuntimeUnavailable as exc:
            log.error("docker_unavailable_at_start", error=str(exc))
            return False
        # What an earlier process left: its members' folders and the scratch workspaces of runs not live now.
        await asyncio.to_thread(sweep_leftovers, self.paths, self.live.__contains__)
        if self.pool is not None:  # after recovery, which removes the members an earlier process left
            self.pool.start()
        return True

    async def _recover_when_engine_returns(self) -> None:
        while True:  # a retry with a fixed pause: the engine gives no event when it comes back
            await asyncio.sleep(RECOVERY_RETRY_SECONDS)
            if await self._recover():
                return

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.pool is not None:
            await self.pool.close()
        await self.manager.close()
        await self.egress_log.close()
        await self.proxy.close()
        await self._runtime.close()


def build_subagent_system(
    settings: Settings,
    stores: Stores,
    delivery: Delivery,
    typing: TypingIndicator,
    file_source: FileSource | None = None,
    mcp: McpServers | None = None,
) -> SubagentService:
    return SubagentService(
        settings, stores, delivery, typing, build_runtime(settings), file_source=file_source, mcp=mcp
    )


def build_runtime(settings: Settings) -> ContainerRuntime:
    """SUBAGENT_RUNTIME's backend. Kubernetes' loads its configuration here (blocking, at start-up) and raises
    runner.kube.kube_errors.KubeConfigError with the line to show when it cannot (the kubernetes extra missing
    too): only this backend imports the client."""
    # Threads start on demand; the cap may rise live.
    if settings.subagent_runtime == RuntimeKind.KUBERNETES:
        from runner.kube.kube_errors import require_client

        require_client()
        from runner.kube.kube_setup import kube_runtime

        return kube_runtime(settings, DataPaths(settings.data_dir).channel_dir, max_concurrency=MAX_SUBAGENTS_CEILING)
    return DockerRuntime(max_concurrency=MAX_SUBAGENTS_CEILING + MAX_WARM_POOL)
