"""The task manager: the lifecycle of a run, from an accepted spawn request to its one recorded outcome.

Every request becomes exactly one run record. Admission (runner/lifecycle/admission.py) decides whether it
awaits approval (approvals.py), starts, waits for a slot (waiting.py) or is refused; a started run gets a run dir, a
channel socket (runner/channel/run_endpoint.py) and a container (runner/lifecycle/container_spec.py), and is
supervised until its container exits or must be stopped (cancel, time limit, token budget, workspace quota). Cancels,
completions and time-outs race on purpose through `RunStore.finish`, which records only the first outcome
with its chat message in one transaction. A slot is free only once its container is confirmed stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from container.protocol import SpawnRequest
from core.delivery import Delivery
from core.logging import get_logger
from core.mcp_servers import McpServers
from core.settings import Settings
from core.store.chats import Chat
from core.store.runs import DuplicateRun, RunRecord, RunStatus
from runner.ipc.batch import RequestOutcome
from runner.lifecycle.admission import Admission, record_request
from runner.lifecycle.approvals import Approvals
from runner.lifecycle.cancels import Cancels
from runner.lifecycle.conclusion import Conclusion, Releases
from runner.lifecycle.manager_ports import RunChannels, RunStores, TypingHolder
from runner.lifecycle.rejections import Refusals
from runner.lifecycle.run_accounting import RunAccounting
from runner.lifecycle.run_container import RunContainers
from runner.lifecycle.run_doors import RunDoors
from runner.lifecycle.run_opening import RunOpener
from runner.lifecycle.supervisor import Supervisor
from runner.lifecycle.waiting import Waiting, WaitingRuns
from runner.runs.live_runs import LiveRun, LiveRuns, StopReason
from runner.runs.outcome import label_for
from runner.runtimes.runtime import ContainerRuntime, ContainerStartError, RuntimeUnavailable
from runner.storage.paths import DataPaths
from runner.storage.run_files import RunFiles
from runner.storage.run_inputs import RunInputsBuilder
from runner.storage.workspaces import Workspaces

log = get_logger(__name__)


class TaskManager:
    def __init__(
        self,
        settings: Settings,
        *,
        stores: RunStores,
        admission: Admission,
        runtime: ContainerRuntime,
        live: LiveRuns,
        channels: RunChannels,
        delivery: Delivery,
        typing: TypingHolder,
        paths: DataPaths,
        files: RunFiles,
        workspaces: Workspaces,
        accounting: RunAccounting,
        inputs: RunInputsBuilder,
        doors: RunDoors,
        mcp: McpServers | None = None,
        containers: RunContainers | None = None,
    ) -> None:
        self._settings = settings
        self._containers = containers or RunContainers(settings, runtime, paths, stores.runs)  # pooled or cold
        self._runs = stores.runs
        self._chats = stores.chats
        self._questions = stores.questions  # a run's open questions end with it (_cleanup)
        self._admission = admission
        self._runtime = runtime
        self._channels = channels
        self._delivery = delivery
        self._typing = typing
        self._paths = paths
        self._files = files
        self._workspaces = workspaces
        self._accounting = accounting
        self._opener = RunOpener(
            settings,
            stores=stores,
            channels=channels,
            delivery=delivery,
            paths=paths,
            files=files,
            inputs=inputs,
            accounting=accounting,
            doors=doors,
            workspaces=workspaces,
            mcp=mcp,
        )
        self._doors = doors
        self._supervisor = Supervisor(runtime, lambda: settings.subagent_timeout_seconds)
        self._releases = Releases(typing)
        self._conclusion = Conclusion(
            settings, runs=stores.runs, delivery=delivery, files=files, releases=self._releases, run_files=stores.files
        )
        self._live = live
        self._cancels = Cancels(
            runs=stores.runs,
            delivery=delivery,
            releases=self._releases,
            supervisor=self._supervisor,
            close_channel=self._close_channel,
        )
        self._rejections = Refusals(stores.runs, delivery, admission.reject_text)
        self.approvals = Approvals(settings, stores.runs, stores.questions, delivery, start=self._approved)
        self.waiting = WaitingRuns(
            lambda: settings.subagent_queue_limit,
            approvals=self.approvals,  # a cancel or a merge also ends the runs awaiting approval
            runs=stores.runs,
            delivery=delivery,
            may_start=lambda chat_id: admission.over_cap(chat_id).status is None,
            start=self._leave_queue,
            on_cancelled=accounting.not_started,
        )
        self.approvals.beside(self.waiting.count, tell=self._rejections.add, count=accounting.not_started)
        self._closing = False
        self._stopping = False
        self._recovered = False

    # --- accepting requests ---------------------------------------------------------------------

    async def on_request(self, chat_id: int, request: SpawnRequest) -> RequestOutcome:
        """Called by the IPC watcher for a validated request of `chat_id` (the folder's chat)."""
        picked_up_at = time.time()
        run_id = request.request_id
        if run_id in self._live or await self._runs.exists(run_id):
            return RequestOutcome.DUPLICATE
        label = label_for(request, await self._runs.continued_run(request.turn_id))
        decision = await self._admission.cancelled_before_pickup(chat_id, request, picked_up_at)
        if decision.status is None and self.approvals.needed(request):  # SUBAGENT_APPROVAL=admins
            return await self.approvals.hold(chat_id, request, label)
        if decision.status is None:
            decision = self._admission.over_cap(chat_id)  # no await between this and the reservation below
        waits = decision.status is RunStatus.REJECTED and self.waiting.has_room(chat_id)  # over a cap: it may wait
        if decision.status is not None:
            status, reason = (RunStatus.QUEUED, None) if waits else (decision.status, decision.reason)
            try:
                await record_request(self._runs, chat_id, request, label, status, reason=reason)
            except DuplicateRun:
                return RequestOutcome.DUPLICATE
            if waits:
                self.waiting.add(run_id, chat_id, request.turn_id, label)
                self.drain_queue()  # a slot may have freed while the record was written
                return RequestOutcome.ACCEPTED
            log.info("run_not_started", run_id=run_id, chat_id=chat_id, status=decision.status, reason=decision.reason)
            self._accounting.not_started(decision.status, decision.reason)
            if decision.status is RunStatus.REJECTED:
                self._rejections.add(chat_id)
            return RequestOutcome.ACCEPTED
        live = LiveRun(id=run_id, chat_id=chat_id, turn_id=request.turn_id, label=label, created_at=picked_up_at)
        self._live.add(live)
        self.waiting.started(chat_id)  # the queue's rotation counts it: fairness holds across both ways in
        self._typing.acquire(chat_id)
        try:
            await record_request(self._runs, chat_id, request, label, RunStatus.QUEUED)
        except BaseException as exc:
            self._releases.release(live)
            self._live.discard(run_id)
            if isinstance(exc, DuplicateRun):  # the same id raced in from another folder
                return RequestOutcome.DUPLICATE
            raise
        log.info("run_queued", run_id=run_id, chat_id=chat_id, turn_id=request.turn_id, label=label)
        live.task = asyncio.create_task(
            self._execute(live, request.task, request.include_context, None, tuple(request.files)), name=f"run-{run_id}"
        )
        return RequestOutcome.ACCEPTED

    def _approved(self, record: RunRecord) -> None:  # in the queue, quietly: it starts as the caps allow
        self.waiting.add(record.id, record.chat_id, record.turn_id, record.label, notify=False)
        self.drain_queue()

    async def tell_unnotified_rejections(self) -> None:
        await self._rejections.tell_unnotified()

    # --- running --------------------------------------------------------------------------------

    def _leave_queue(self, entry: Waiting) -> None:
        """A waiting run got a slot: reserved here, synchronously, before the queue checks the caps again."""
        live = LiveRun(id=entry.run_id, chat_id=entry.chat_id, turn_id=entry.turn_id, label=entry.label)
        self._live.add(live)
        self._typing.acquire(entry.chat_id)
        live.task = asyncio.create_task(self._start_waited(live), name=f"run-{entry.run_id}")

    async def _start_waited(self, live: LiveRun) -> None:
        # A cancel that came first makes mark_running refuse it in _execute.
        if (record := await self._runs.get(live.id)) is not None:
            live.created_at = record.created_at  # its queue wait counts from the request
            await self._execute(live, record.task, record.include_context, record, record.files)

    def recovered(self) -> None:
        """Recovery has reconciled the engine: from now on queued runs start as slots free."""
        self._recovered = True
        self.drain_queue()

    def drain_queue(self) -> None:
        # Not before recovery: the engine may be down, and the held runs are not reconciled yet.
        if self._recovered and not self._closing and not self._stopping:
            self.waiting.drain()

    async def _execute(
        self, live: LiveRun, task: str, include_context: bool, record: RunRecord | None, files: tuple[str, ...]
    ) -> None:
        """A new (or restarted) run: check the workspace, open its channel, start its container, supervise it."""

        async def body(chat: Chat) -> None:
            over = await self._workspaces.over_quota(chat.folder)
            if over is not None:
                await self._conclude(live, RunStatus.FAILED, error=over)
                return
            claimed = await self._containers.claim(live, chat)  # placed, then a pool member (or None: cold below)
            listening = claimed.listening if claimed is not None else None
            prepared = await self._opener.prepare(live, chat, task, include_context, record, files, listening=listening)
            marked_running_at = time.time()
            if not await self._runs.mark_running(live.id, live.inbox.session_in if live.inbox else None):
                return  # cancelled while queued
            await self._opener.serve(prepared)  # only now: a claimed member's agent is answered its task at once
            live.started_monotonic = time.monotonic()
            try:
                live.container_id = await self._containers.start(live, claimed)
            except (RuntimeUnavailable, ContainerStartError) as exc:
                log.error("container_start_failed", run_id=live.id, error=str(exc))
                live.stopped = True
                await self._conclude(live, RunStatus.FAILED, error=f"could not start its container: {exc}")
                return
            if live.stop_requested.is_set():  # cancelled while it started: killed before anything else
                self._supervisor.kill_soon(live)
            await self._accounting.started(live, live.container_id, marked_running_at)
            log.info("run_started", run_id=live.id, container_id=live.container_id)
            await self._supervise(live, chat)

        await self._guarded(live, body)

    async def _resume(self, live: LiveRun, record: RunRecord) -> None:
        """A run re-attached after a restart: its container runs (or has exited) already."""

        async def body(chat: Chat) -> None:
            await self._containers.reattached(live, chat)  # its placement as it started, before its channel opens
            await self._opener.open(live, chat, record.task, record.include_context, record, record.files)
            await self._supervise(live, chat)

        await self._guarded(live, body)

    async def _guarded(self, live: LiveRun, body: Callable[[Chat], Awaitable[None]]) -> None:
        try:
            chat = await self._chats.get(live.chat_id)
            if chat is None:
                raise RuntimeError(f"chat {live.chat_id} is unknown")
            await body(chat)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("run_failed_unexpectedly", run_id=live.id)
            await self._conclude(live, RunStatus.FAILED, error=f"internal error: {exc}")
        finally:
            await self._cleanup(live)

    # --- supervising ----------------------------------------------------------------------------

    async def _supervise(self, live: LiveRun, chat: Chat) -> None:
        async with self._conclusion.on_report(live, chat):
            exit_code = await self._supervisor.until_exit(
                live, lambda: self._workspaces.over_quota(chat.folder, live.id)
            )
        await self._accounting.stopped(live)
        self.drain_queue()  # its slot is free now that its container is stopped
        quota_hit = live.stop_reason is StopReason.WORKSPACE_QUOTA
        quota = await self._workspaces.over_quota(chat.folder) if quota_hit else None
        await self._conclusion.settle(live, chat, exit_code, quota)

    async def on_budget_exhausted(self, run_id: str) -> None:
        """The channel refused a call over SUBAGENT_MAX_TOKENS: the run ends with that message."""
        if (live := self._live.get(run_id)) is not None:
            log.warning("run_token_budget_exhausted", run_id=run_id, limit=self._settings.subagent_max_tokens)
            live.request_stop(StopReason.TOKEN_BUDGET)

    def on_allowance_spent(self, run_id: str, reason: str) -> None:
        """The channel refused a call: the run's chat (or the bot) has no allowance left today; the run ends."""
        if (live := self._live.get(run_id)) is not None:
            log.warning("run_daily_allowance_spent", run_id=run_id, chat_id=live.chat_id, reason=reason)
            live.request_stop(StopReason.DAILY_ALLOWANCE, reason)

    async def _conclude(self, live: LiveRun, status: str, *, error: str) -> bool:
        return await self._conclusion.record(live, status, error=error)

    async def _close_channel(self, run_id: str) -> None:
        """The run's socket and its door to the web, if it has one: nothing of it listens any more."""
        try:
            await self._channels.close_run(run_id)
            await self._doors.close(run_id)
        except Exception:
            log.exception("channel_close_failed", run_id=run_id)

    async def _cleanup(self, live: LiveRun) -> None:
        await self._close_channel(live.id)
        if self._closing:
            return
        if self._questions is not None:  # nobody is left to take their answers (a door's cancelled waits among them)
            await self._questions.end_run(live.id, "its run ended")
        if live.container_id is not None:
            await self._supervisor.remove(live, self._files.keep_logs, lambda: self._stopping)
        await self._containers.release(live)  # its channel and scratch folders
        live.stopped = True
        await self._accounting.ended(live)
        self._releases.release(live)
        self._live.discard(live.id)
        self.drain_queue()

    # --- cancelling -----------------------------------------------------------------------------

    async def cancel_run(self, chat_id: int, run_id: str) -> RunStatus | None:
        live = self._live.get(run_id)
        reason = "cancelled by a chat admin"
        ours = live is not None and live.chat_id == chat_id
        if live is not None and ours and self._cancels.stop_now(live) and await self._cancels.record(live, reason):
            return RunStatus.CANCELLED
        if await self.waiting.cancel_run(chat_id, run_id, reason):
            return RunStatus.CANCELLED
        record = await self._runs.get(run_id)
        return record.status if record is not None and record.chat_id == chat_id else None

    async def cancel_chat(self, chat_id: int, reason: str) -> int:
        self._admission.chat_cancelled(chat_id)
        # The kills are asked before the first await; the queue is emptied before any of them can free a slot.
        stopping = [live for live in self._live.all() if live.chat_id == chat_id and self._cancels.stop_now(live)]
        queued = await self.waiting.cancel_chat(chat_id, reason)
        return queued + await self._cancels.record_all(stopping, reason)

    async def cancel_turn(self, turn_id: str, reason: str) -> int:
        stopping = [live for live in self._live.all() if live.turn_id == turn_id and self._cancels.stop_now(live)]
        queued = await self.waiting.cancel_turn(turn_id, reason)
        return queued + await self._cancels.record_all(stopping, reason)

    # --- after a restart ------------------------------------------------------------------------

    def _adopt(self, record: RunRecord, container_id: str | None, started_at: float | None) -> LiveRun:
        live = self._live.get(record.id)
        if live is None or not live.recovering:
            live = LiveRun(id=record.id, chat_id=record.chat_id, turn_id=record.turn_id, label=record.label)
            self._live.add(live)
        live.recovering = False
        live.container_id = container_id
        if started_at is not None:
            # The time-out counts from the container's real start, not from our restart.
            live.started_monotonic = time.monotonic() - max(time.time() - started_at, 0.0)
        if not live.typing_released:  # a held run cancelled before recovery reached it shows no typing
            self._typing.acquire(record.chat_id)
        return live

    def reattach(self, record: RunRecord, container_id: str, started_at: float | None) -> None:
        """Supervise a run whose container survived the restart; its result is delivered as usual."""
        live = self._adopt(record, container_id, started_at or time.time())
        live.task = asyncio.create_task(self._resume(live, record), name=f"run-{record.id}")

    async def interrupt(self, record: RunRecord, reason: str) -> bool:
        """A run whose container is gone: recorded `interrupted` and the chat is told, once."""
        live = self._live.get(record.id)
        if live is None or not live.recovering:
            live = LiveRun(id=record.id, chat_id=record.chat_id, turn_id=record.turn_id, label=record.label)
            live.recovering = True
        live.released = live.stopped = True
        self._live.discard(record.id)
        await self._containers.release(live)  # its channel and scratch folders
        recorded = await self._conclude(live, RunStatus.INTERRUPTED, error=reason)
        if recorded:
            await self._accounting.ended(live)
        return recorded

    async def close(self) -> None:
        """Shutdown: leave running containers for the next start to re-attach; finish what has ended."""
        self._stopping = True  # removals waiting for the engine give up: the next start's recovery does them
        await self._rejections.close()
        await self.waiting.close()
        tasks = [(r.task, r.released or r.result_recorded) for r in self._live.all() if r.task is not None]
        concluded = [task for task, ended in tasks if ended]
        running = [task for task, ended in tasks if not ended]
        # A run whose outcome is recorded only has its logs to keep and its container to remove (one that
        # reported is waited for: it exits by itself or is stopped RESULT_GRACE_SECONDS after its result).
        await asyncio.gather(*concluded, return_exceptions=True)
        self._closing = True
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
