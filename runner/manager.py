"""The task manager: turns accepted spawn requests into containers under the concurrency caps.

Every request becomes exactly one run record. A request over a cap is recorded `rejected` and the chat
is told; otherwise the run is `queued`, then `running` in its own container, and ends with one final
status. Cancels, completions and time-outs race on purpose through `RunStore.finish`, which records
only the first outcome; the run's chat message is stored in that same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from bot.commands import RunSummary
from bot.delivery import Delivery
from bot.logging import get_logger
from bot.settings import LLMProvider, Settings
from bot.store.chats import Chat, ChatStore
from bot.store.messages import MessageStore
from bot.store.runs import (
    CANCELLED,
    COMPLETED,
    FAILED,
    INTERRUPTED,
    REJECTED,
    TIMED_OUT,
    DuplicateRun,
    RunRecord,
    RunStore,
)
from bot.store.turns import TurnStore
from bot.typing_indicator import TypingIndicator
from container.protocol import (
    LLM_SOCKET_FILE,
    LOG_FILE,
    RESULT_FILE,
    SESSION_IN_FILE,
    SESSION_OUT_FILE,
    TASK_FILE,
    RunResult,
    SpawnRequest,
    TaskSpec,
    write_json_atomic,
)
from runner.docker_runtime import container_name
from runner.ipc import container_owner, ensure_chat_dirs
from runner.ipc_outcome import RequestOutcome
from runner.live_runs import LiveRun, LiveRuns
from runner.paths import DataPaths, container_user, hand_to_container
from runner.rejections import RejectionNotices
from runner.runtime import (
    LABEL_APP,
    LABEL_CHAT_ID,
    LABEL_INSTANCE,
    LABEL_RUN_ID,
    ContainerRuntime,
    ContainerSpec,
    ContainerStartError,
    Mount,
    RuntimeUnavailable,
)

log = get_logger(__name__)

SUBAGENT_SENDER = "[Subagent]"
CONTEXT_MESSAGES = 20  # recent chat lines handed to a subagent with include_context=True
MAX_RESULT_CHARS = 20_000  # a result longer than this is cut before it is stored and sent
CONTAINER_RUN_DIR = "/crewbot/run"
CONTAINER_IPC_DIR = "/crewbot/ipc"
CONTAINER_WORKSPACE_DIR = "/workspace"
ENGINE_RETRY_SECONDS = 2.0  # while the engine is unreachable, how often a waiting run asks again


class LlmGateway(Protocol):
    """What the manager needs of the LLM proxy: one socket per run, closed when the run ends."""

    async def open_run(self, run_id: str, socket_path: Path) -> None: ...

    async def close_run(self, run_id: str) -> None: ...


def label_for(request: SpawnRequest) -> str:
    if request.label and request.label.strip():
        return " ".join(request.label.split())[:80]
    first = request.task.strip().splitlines()[0] if request.task.strip() else "task"
    return first[:60]


def subagent_content(label: str, body: str) -> str:
    """The stored and sent form of a subagent's outcome, as the design's contract fixes it."""
    return f"[Task: {label}]\n{body}"


class TaskManager:
    def __init__(
        self,
        settings: Settings,
        *,
        runs: RunStore,
        chats: ChatStore,
        messages: MessageStore,
        turns: TurnStore,
        runtime: ContainerRuntime,
        live: LiveRuns,
        llm: LlmGateway,
        delivery: Delivery,
        typing: TypingIndicator,
        paths: DataPaths,
    ) -> None:
        self._settings = settings
        self._runs = runs
        self._chats = chats
        self._messages = messages
        self._turns = turns
        self._runtime = runtime
        self._llm = llm
        self._delivery = delivery
        self._typing = typing
        self._paths = paths
        self._live = live
        self._chat_cancel_before: dict[int, float] = {}
        self._rejections = RejectionNotices(self._tell_rejected)
        self._closing = False

    # --- what the proxy and the app ask ---------------------------------------------------------

    def live_runs(self, chat_id: int | None = None) -> int:
        return self._live.count(chat_id)

    # --- accepting requests ---------------------------------------------------------------------

    async def on_request(self, chat_id: int, request: SpawnRequest) -> RequestOutcome:
        """Called by the IPC watcher for a validated request of `chat_id` (the folder's chat)."""
        run_id = request.request_id
        if run_id in self._live or await self._runs.exists(run_id):
            return RequestOutcome.DUPLICATE
        label = label_for(request)
        status, reason = await self._admission(chat_id, request)
        if status is None:
            # Counting and reserving happen with no await in between, so concurrent requests cannot
            # all pass the cap check together.
            running_total, running_chat = self.live_runs(), self.live_runs(chat_id)
            if running_total >= self._settings.max_concurrent_subagents:
                status, reason = REJECTED, f"{running_total} of {self._settings.max_concurrent_subagents} running"
            elif running_chat >= self._settings.max_subagents_per_chat:
                status, reason = REJECTED, f"{running_chat} running in this chat"
        if status is not None:
            try:
                await self._runs.create(
                    run_id, chat_id, request.turn_id, request.task, label, request.include_context, status, reason
                )
            except DuplicateRun:
                return RequestOutcome.DUPLICATE
            log.info("run_not_started", run_id=run_id, chat_id=chat_id, status=status, reason=reason)
            if status == REJECTED:
                self._rejections.add(chat_id)
            return RequestOutcome.ACCEPTED
        live = LiveRun(id=run_id, chat_id=chat_id, turn_id=request.turn_id, label=label)
        self._live.add(live)
        self._typing.acquire(chat_id)
        try:
            await self._runs.create(
                run_id, chat_id, request.turn_id, request.task, label, request.include_context, "queued"
            )
        except BaseException as exc:
            self._release(live)
            self._live.discard(run_id)
            if isinstance(exc, DuplicateRun):  # the same id raced in from another folder
                return RequestOutcome.DUPLICATE
            raise
        log.info("run_queued", run_id=run_id, chat_id=chat_id, turn_id=request.turn_id, label=label)
        live.task = asyncio.create_task(self._execute(live, request), name=f"run-{run_id}")
        return RequestOutcome.ACCEPTED

    async def _admission(self, chat_id: int, request: SpawnRequest) -> tuple[str | None, str | None]:
        """A request cancelled before pickup (its turn aborted, or the chat's runs cancelled) never starts."""
        if request.turn_id is not None and await self._turns.status(request.turn_id) == "aborted":
            return CANCELLED, "its turn was aborted before the request was picked up"
        cutoff = self._chat_cancel_before.get(chat_id)
        if cutoff is not None and request.created_at <= cutoff:
            return CANCELLED, "the chat's runs were cancelled before the request was picked up"
        return None, None

    async def _tell_rejected(self, chat_id: int, count: int) -> None:
        # Stored now, sent in the background: the IPC watcher never waits on Telegram.
        await self._delivery.notice(chat_id, self._reject_text(chat_id, count), wait=False)

    def _reject_text(self, chat_id: int, count: int) -> str:
        template = self._settings.subagent_reject_message
        values = {
            "running": self.live_runs(),
            "limit": self._settings.max_concurrent_subagents,
            "chat_running": self.live_runs(chat_id),
            "chat_limit": self._settings.max_subagents_per_chat,
            "count": count,
            "not_started": "your task was" if count == 1 else f"{count} tasks were",
        }
        try:
            return template.format(**values)
        except (KeyError, IndexError, ValueError):
            return template

    # --- running --------------------------------------------------------------------------------

    async def _execute(self, live: LiveRun, request: SpawnRequest) -> None:
        """A new run: prepare its folders, start its container, supervise it to the end."""

        async def body(chat: Chat, run_dir: Path) -> None:
            session_in = await self._prepare(live, request, chat, run_dir)
            await self._llm.open_run(live.id, run_dir / LLM_SOCKET_FILE)
            if not await self._runs.mark_running(live.id, session_in):
                return  # cancelled while queued
            live.started_monotonic = time.monotonic()
            try:
                live.container_id = await self._runtime.start(self._spec(live, chat, run_dir))
            except (RuntimeUnavailable, ContainerStartError) as exc:
                log.error("container_start_failed", run_id=live.id, error=str(exc))
                await self._conclude(live, FAILED, error=f"could not start its container: {exc}")
                return
            await self._runs.set_container(live.id, live.container_id)
            log.info("run_started", run_id=live.id, container_id=live.container_id[:12])
            if live.cancelled:  # a cancel arrived while the engine was creating the container
                await self._runtime.kill(live.container_id)
            await self._await_container(live, chat, run_dir)

        await self._guarded(live, body)

    async def _resume(self, live: LiveRun) -> None:
        """A run re-attached after a restart: its container runs (or has exited) already."""

        async def body(chat: Chat, run_dir: Path) -> None:
            await self._llm.open_run(live.id, run_dir / LLM_SOCKET_FILE)
            await self._await_container(live, chat, run_dir)

        await self._guarded(live, body)

    async def _guarded(self, live: LiveRun, body: Callable[[Chat, Path], Awaitable[None]]) -> None:
        run_dir = self._paths.run_dir(live.id)
        try:
            chat = await self._chats.get(live.chat_id)
            if chat is None:
                raise RuntimeError(f"chat {live.chat_id} is unknown")
            await body(chat, run_dir)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("run_failed_unexpectedly", run_id=live.id)
            await self._conclude(live, FAILED, error=f"internal error: {exc}")
        finally:
            await self._cleanup(live, run_dir)

    # --- after a restart ------------------------------------------------------------------------

    def _adopt(self, record: RunRecord, container_id: str | None, started_at: float | None) -> LiveRun:
        live = LiveRun(id=record.id, chat_id=record.chat_id, turn_id=record.turn_id, label=record.label)
        live.container_id = container_id
        if started_at is not None:
            # The time-out counts from the container's real start, not from our restart.
            live.started_monotonic = time.monotonic() - max(time.time() - started_at, 0.0)
        self._live.add(live)
        self._typing.acquire(record.chat_id)
        return live

    def reattach(self, record: RunRecord, container_id: str, started_at: float | None) -> None:
        """Supervise a run whose container survived the restart; its result is delivered as usual."""
        live = self._adopt(record, container_id, started_at or time.time())
        live.task = asyncio.create_task(self._resume(live), name=f"run-{record.id}")

    def restart_queued(self, record: RunRecord) -> None:
        """A run accepted before the restart whose container never started: start it now."""
        request = SpawnRequest(
            request_id=record.id,
            task=record.task,
            label=record.label,
            include_context=record.include_context,
            turn_id=record.turn_id,
        )
        live = self._adopt(record, None, None)
        live.task = asyncio.create_task(self._execute(live, request), name=f"run-{record.id}")

    async def interrupt(self, record: RunRecord, reason: str) -> bool:
        """A run whose container is gone: recorded `interrupted` and the chat is told, once."""
        live = LiveRun(id=record.id, chat_id=record.chat_id, turn_id=record.turn_id, label=record.label)
        live.released = True  # it holds no slot and no typing in this process
        return await self._conclude(live, INTERRUPTED, error=reason)

    async def _wait_for_exit(self, live: LiveRun) -> int | None:
        """The container's exit code, or None at the run's time limit. An engine that drops out
        meanwhile (a daemon restart) is waited for: the container keeps running without it."""
        assert live.container_id is not None and live.started_monotonic is not None
        while True:
            remaining = self._settings.subagent_timeout_seconds - (time.monotonic() - live.started_monotonic)
            try:
                return await self._runtime.wait(live.container_id, max(remaining, 0.0))
            except RuntimeUnavailable as exc:
                if remaining <= 0:
                    return None
                log.warning("engine_unreachable_while_waiting", run_id=live.id, error=str(exc))
                await asyncio.sleep(min(ENGINE_RETRY_SECONDS, remaining))

    async def _await_container(self, live: LiveRun, chat: Chat, run_dir: Path) -> None:
        assert live.container_id is not None
        exit_code = await self._wait_for_exit(live)
        if exit_code is None:
            try:
                await self._runtime.kill(live.container_id)
            except RuntimeUnavailable as exc:  # recovery removes it once the engine is back
                log.error("timed_out_container_not_killed", run_id=live.id, error=str(exc))
            limit = self._settings.subagent_timeout_seconds
            log.warning("run_timed_out", run_id=live.id, timeout_seconds=limit)
            await self._conclude(live, TIMED_OUT, error=f"timed out after {limit:g} s and was stopped")
            return
        if live.cancelled:
            return
        await self._collect(live, chat, run_dir, exit_code)

    async def _collect(self, live: LiveRun, chat: Chat, run_dir: Path, exit_code: int) -> None:
        result_path = run_dir / RESULT_FILE
        try:
            result = RunResult.model_validate_json(result_path.read_bytes())
        except (OSError, ValidationError) as exc:
            reason = "no result file" if isinstance(exc, OSError) else "an unreadable result file"
            await self._conclude(live, FAILED, error=f"exited with code {exit_code} and {reason}")
            return
        if result.run_id != live.id:
            await self._conclude(live, FAILED, error="its result file names another run")
            return
        if result.status == "failed":
            await self._conclude(live, FAILED, error=result.error or f"failed (exit code {exit_code})")
            return
        session_out = await asyncio.to_thread(self._save_session, chat, live.id, run_dir)
        await self._conclude(live, COMPLETED, result=result.result or "(no output)", session_out=session_out)
        if session_out is not None:
            await self._runs.set_session(live.chat_id, session_out)

    async def _conclude(
        self,
        live: LiveRun,
        status: str,
        *,
        result: str | None = None,
        error: str | None = None,
        session_out: str | None = None,
    ) -> bool:
        """Record the run's one outcome with its [Subagent] message, then send that message."""
        if status == COMPLETED:
            body = result or ""
            if len(body) > MAX_RESULT_CHARS:
                body = body[:MAX_RESULT_CHARS] + f"\n… [{len(body) - MAX_RESULT_CHARS} more characters cut]"
        elif status == TIMED_OUT:
            body = f"Timed out: {error}"
        elif status == INTERRUPTED:
            body = f"Interrupted: {error}"
        else:
            body = f"Failed: {error}"
        outgoing = self._delivery.outgoing(
            live.chat_id, subagent_content(live.label, body), kind="subagent", sender_name=SUBAGENT_SENDER
        )
        recorded = await self._runs.finish(
            live.id, status, result=result, error=error, session_out=session_out, outgoing=outgoing
        )
        if not recorded:
            log.info("run_outcome_already_recorded", run_id=live.id, attempted=status)
            return False
        log.info("run_finished", run_id=live.id, status=status)
        self._release(live)
        await self._delivery.flush(live.chat_id)
        return True

    async def _prepare(self, live: LiveRun, request: SpawnRequest, chat: Chat, run_dir: Path) -> str | None:
        context: list[str] = []
        if request.include_context:
            recent = await self._messages.recent(live.chat_id, CONTEXT_MESSAGES)
            context = [f"{m.sender_name}: {m.content}" for m in recent]
        spec = TaskSpec(
            run_id=live.id,
            task=request.task,
            label=live.label,
            context=context,
            provider_kind="anthropic" if self._settings.llm_provider is LLMProvider.ANTHROPIC else "openai",
            model=self._settings.effective_subagent_model or "offline-subagent",
        )
        session_in = await self._runs.current_session(live.chat_id)
        await asyncio.to_thread(self._write_run_dir, run_dir, chat, spec, session_in)
        return session_in

    def _write_run_dir(self, run_dir: Path, chat: Chat, spec: TaskSpec, session_in: str | None) -> None:
        # Everything the container mounts must be writable by its (non-root) user.
        hand_to_container(run_dir)
        hand_to_container(self._paths.workspace(chat.folder))
        ensure_chat_dirs(self._paths.ipc_root, chat.folder, owner=container_owner())
        write_json_atomic(run_dir / TASK_FILE, spec)
        if session_in is not None:
            source = self._paths.session_file(chat.folder, session_in)
            if source.is_file():
                shutil.copyfile(source, run_dir / SESSION_IN_FILE)

    def _save_session(self, chat: Chat, run_id: str, run_dir: Path) -> str | None:
        produced = run_dir / SESSION_OUT_FILE
        if not produced.is_file():
            return None
        target = self._paths.session_file(chat.folder, run_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(produced, target)
        return run_id

    def _spec(self, live: LiveRun, chat: Chat, run_dir: Path) -> ContainerSpec:
        s = self._settings
        return ContainerSpec(
            name=container_name(live.id),
            image=s.subagent_image,
            command=[],
            labels={
                LABEL_APP: "1",
                LABEL_INSTANCE: self._paths.instance_id,
                LABEL_RUN_ID: live.id,
                LABEL_CHAT_ID: str(live.chat_id),
            },
            mounts=[
                Mount(self._paths.workspace(chat.folder).resolve(), CONTAINER_WORKSPACE_DIR),
                Mount(run_dir.resolve(), CONTAINER_RUN_DIR),
                Mount((self._paths.ipc_root / chat.folder).resolve(), CONTAINER_IPC_DIR),
            ],
            user=container_user(),
            network=s.subagent_network,
            memory=s.subagent_memory,
            cpus=s.subagent_cpus,
            pids=s.subagent_pids,
            workdir=CONTAINER_WORKSPACE_DIR,
        )

    async def _cleanup(self, live: LiveRun, run_dir: Path) -> None:
        with contextlib.suppress(Exception):
            await self._llm.close_run(live.id)
        if live.container_id is not None and not self._closing:
            try:
                logs = await self._runtime.logs(live.container_id)
                await asyncio.to_thread((run_dir / LOG_FILE).write_bytes, logs)
                await self._runtime.remove(live.container_id)
            except Exception as exc:
                log.warning("container_cleanup_failed", run_id=live.id, error=str(exc))
        if not self._closing:
            self._release(live)
            self._live.discard(live.id)

    def _release(self, live: LiveRun) -> None:
        """Free the run's slot and its hold on the chat's typing indicator, once."""
        if live.released:
            return
        live.released = True
        self._typing.release(live.chat_id)

    # --- cancelling -----------------------------------------------------------------------------

    async def _cancel(self, live: LiveRun, reason: str) -> bool:
        if live.cancelled:
            return False
        live.cancelled = True  # from here the proxy refuses its calls and it no longer counts for the cap
        recorded = await self._runs.finish(live.id, CANCELLED, error=f"cancelled: {reason}")
        if recorded:
            self._release(live)
        with contextlib.suppress(Exception):
            await self._llm.close_run(live.id)
        if live.container_id is not None:
            try:
                await self._runtime.kill(live.container_id)
            except Exception as exc:
                log.warning("container_kill_failed", run_id=live.id, error=str(exc))
        log.info("run_cancelled", run_id=live.id, reason=reason, recorded=recorded)
        return recorded

    async def cancel_run(self, chat_id: int, run_id: str) -> str:
        live = self._live.get(run_id)
        if live is not None and live.chat_id == chat_id and await self._cancel(live, "cancelled by a chat admin"):
            return CANCELLED
        record = await self._runs.get(run_id)
        if record is None or record.chat_id != chat_id:
            return "not_found"
        return record.status

    async def cancel_chat(self, chat_id: int, reason: str) -> int:
        self._chat_cancel_before[chat_id] = time.time()
        targets = [r for r in self._live.all() if r.chat_id == chat_id]
        results = await asyncio.gather(*(self._cancel(r, reason) for r in targets))
        return sum(results)

    async def cancel_turn(self, turn_id: str, reason: str) -> int:
        targets = [r for r in self._live.all() if r.turn_id == turn_id]
        results = await asyncio.gather(*(self._cancel(r, reason) for r in targets))
        return sum(results)

    async def list_runs(self, chat_id: int, limit: int) -> list[RunSummary]:
        records: list[RunRecord] = await self._runs.for_chat(chat_id, limit)
        return [RunSummary(id=r.id, label=r.label, status=r.status, created_at=r.created_at) for r in records]

    async def close(self) -> None:
        """Shutdown: leave running containers for the next start to re-attach; finish what has ended."""
        await self._rejections.close()
        concluded = [r.task for r in self._live.all() if r.task is not None and r.released]
        running = [r.task for r in self._live.all() if r.task is not None and not r.released]
        # A run whose outcome is recorded only has its logs to keep and its container to remove.
        await asyncio.gather(*concluded, return_exceptions=True)
        self._closing = True
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
