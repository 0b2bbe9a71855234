"""One run's end of its channel on the host: hands out the task, takes progress messages, the session
and the result, each within the run's budgets and only while the run is live.

Nothing here touches a file the container can write: what arrives is a bounded request body, already
validated by runner/channel/run_api.py. The result and session are held in memory until the container exits;
the task manager decides the outcome.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from container.protocol import (
    ASK_PATH,
    FILES_PATH,
    MODEL_PATH,
    RESULT_PATH,
    SESSION_PATH,
    AskAnswer,
    AskQuestion,
    FileMeta,
    McpCall,
    ProgressMessage,
    RunResult,
    TaskSpec,
)
from core.delivery import Delivery
from core.logging import get_logger
from core.store.runs import ProgressOutcome, RunStore
from runner.channel.conversation_limits import ConversationLimits
from runner.channel.mcp_desk import RunMcpDesk
from runner.channel.run_api import INVALID_STATUS, ChannelRefused
from runner.channel.run_file_desk import ReceivedFile, RunFileDesk
from runner.channel.run_questions import RunAsking
from runner.channel.sessions import SessionRejected, clean
from runner.channel.workspace_desk import ArchiveStore, WorkspaceDesk
from runner.runs.live_runs import LiveRun, StopReason
from runner.runs.outcome import SUBAGENT_SENDER

log = get_logger(__name__)

MAX_SESSION_UPLOADS = 3  # a run hands its session back once; a few retries, never an unbounded CPU sink
# Model steps a run may ask for beyond its step limit (a step retried after a lost connection). Each step's
# conversation is validated on the host, so invalid ones count too: a container cannot make the host spin.
EXTRA_MODEL_STEPS = 5
# The agent's loop never sends an invalid body; a run that sends this many is not that loop, and is stopped.
MAX_INVALID_REQUESTS = 3


class RunInbox:
    """The `RunEndpoint` of one live run."""

    def __init__(
        self,
        live: LiveRun,
        spec: TaskSpec,
        *,
        socket_path: Path,
        runs: RunStore,
        delivery: Delivery,
        max_messages: int,
        session_max_messages: int,
        files: RunFileDesk,
        workspace: ArchiveStore | None = None,
        asking: RunAsking | None = None,
        mcp: Callable[[Callable[[], None], Callable[[int, str], None]], RunMcpDesk] | None = None,
    ) -> None:
        self._live = live
        self._spec = spec
        self._socket_path = socket_path
        self._runs = runs
        self._delivery = delivery
        self._max_messages = max_messages
        self._session_max_messages = session_max_messages
        self._files = files
        self._asking = asking  # None: this run cannot ask its chat (no chat side in this process)
        self.result_received: RunResult | None = None
        self.session_json: bytes | None = None
        self.session_in: str | None = None  # the session the run started from, for its record
        self.reported = asyncio.Event()
        # Its agent asked for the chat's workspace (a synced run's first request after its task): it is alive. A
        # task request alone says nothing of that: one sent before its container died is still served.
        self.workspace_asked = asyncio.Event()
        self._session_uploads = 0
        self._model_steps = 0
        self._stepping = False
        self._invalid_requests = 0
        self._retried_messages: set[str] = set()  # at most the run's accepted messages: only those repeat
        self._over_budget_messages = 0
        self.limits = ConversationLimits.for_task(spec, EXTRA_MODEL_STEPS)
        # The MCP tools its task offered, called here for it (built with this run's liveness check); None: none.
        self.mcp = mcp(self._check_not_stopping, self.invalid) if mcp is not None else None
        # Its chat's archive when the run syncs its workspace over the channel (no shared folder); else None.
        self.workspace = (
            None
            if workspace is None
            else WorkspaceDesk(
                workspace,
                check_live=self._workspace_live,
                invalid=self.invalid,
                run_id=live.id,
                chat_id=live.chat_id,
            )
        )

    def _workspace_live(self) -> None:
        self.workspace_asked.set()
        self._check_live()

    def _check_live(self) -> None:
        if self._live.cancelled or self._live.released:
            raise ChannelRefused(403, f"run {self._live.id} is cancelled or finished")

    def _check_not_stopping(self) -> None:
        """Model steps and sessions (the costly bodies) end with a stop asked for (too many invalid bodies, its
        time or budget is up), not only once the engine has killed the container. Its messages and result are
        still taken: they are small, and the stop decides the outcome."""
        self._check_live()
        if self._live.stop_reason is not None:
            raise ChannelRefused(403, f"run {self._live.id} is being stopped ({self._live.stop_reason})")

    def admit(self, path: str) -> None:
        """Before a body is read: refuse what would be refused anyway once read, so that a run cannot make the
        host read and measure megabytes only to say no. Refusals a working agent never meets count as invalid.
        A progress message is read first: its retry must learn it was sent, and it is small once valid."""
        self._check_live()
        if path in (MODEL_PATH, SESSION_PATH):
            self._check_not_stopping()
        refusal: ChannelRefused | None = None
        if path == MODEL_PATH:
            allowed = self._spec.max_steps + EXTRA_MODEL_STEPS
            if self._stepping:
                refusal = ChannelRefused(409, "one model step at a time: wait for the answer to the last one")
            elif self._model_steps >= allowed:
                refusal = ChannelRefused(
                    429, f"this run has asked for {allowed} model steps; its limit is {self._spec.max_steps}"
                )
        elif path == SESSION_PATH and self._session_uploads >= MAX_SESSION_UPLOADS:
            refusal = ChannelRefused(429, f"this run has handed its session back {MAX_SESSION_UPLOADS} times already")
        if refusal is not None:
            self.invalid(refusal.status, refusal.reason)
            raise refusal
        if path == RESULT_PATH and self.result_received is not None:
            raise ChannelRefused(409, "this run has reported its result already")
        if path == FILES_PATH:
            self._files.admit()
        if path == ASK_PATH:
            self._check_not_stopping()

    # --- files: runner/channel/run_file_desk.py ---------------------------------------------------

    @property
    def max_file_bytes(self) -> int:
        return self._files.max_file_bytes

    def offered_file(self, index: int) -> Path:
        self._check_live()
        return self._files.offered_file(index)

    async def begin_upload(self, meta: FileMeta) -> Path | None:
        self._check_not_stopping()  # a run being stopped sends no more files (its result is still taken)
        return await self._files.begin(meta)

    async def file_received(self, meta: FileMeta, received: ReceivedFile) -> str:
        return await self._files.received(meta, received)

    async def abandon_upload(self, target: Path) -> None:
        await self._files.abandon(target)

    def _over_messages(self) -> str:
        return f"this run has sent its {self._max_messages} progress messages; put the rest in the final answer"

    def invalid(self, status: int, reason: str) -> None:
        """A body was refused as invalid or over a cap: the run is stopped at MAX_INVALID_REQUESTS of them."""
        self._invalid_requests += 1
        log.warning("run_request_invalid", run_id=self._live.id, status=status, reason=reason)
        if self._invalid_requests >= MAX_INVALID_REQUESTS:
            self._live.request_stop(StopReason.INVALID_REQUESTS)

    async def task(self) -> TaskSpec:
        self._check_live()
        return self._spec

    async def message(self, message: ProgressMessage) -> str:
        self._check_live()
        staged = self._delivery.outgoing(self._live.chat_id, message.text, kind="progress", sender_name=SUBAGENT_SENDER)
        outgoing = replace(staged, run_id=self._live.id)
        outcome = await self._runs.add_progress(self._live.id, message.message_id, outgoing, self._max_messages)
        if outcome is ProgressOutcome.OVER_BUDGET:
            # The tool stops sending once told (container/tools.py): a run that goes on is not that loop.
            self._over_budget_messages += 1
            if self._over_budget_messages > 1:
                self.invalid(429, self._over_messages())
            else:
                log.warning("progress_message_over_budget", run_id=self._live.id, limit=self._max_messages)
            raise ChannelRefused(429, self._over_messages())
        if outcome is ProgressOutcome.NOT_LIVE:
            raise ChannelRefused(403, f"run {self._live.id} is cancelled or finished")
        if outcome is ProgressOutcome.DUPLICATE:
            # A retry after a lost answer learns it went out, once; each repeat still costs the host a store read.
            if message.message_id in self._retried_messages:
                self.invalid(409, "a progress message repeated after its retry was answered")
                raise ChannelRefused(409, "this message was sent, and its retry was answered so already")
            self._retried_messages.add(message.message_id)
            return "already sent"
        self._delivery.send_soon(self._live.chat_id)
        return "sent"

    async def ask(self, question: AskQuestion) -> AskAnswer:
        """The chat's answer to the run's question (runner/channel/run_questions.py), once it has one."""
        self._check_not_stopping()
        if self._asking is None:
            raise ChannelRefused(403, "this bot takes no questions from subagents here")
        return await self._asking.ask(question)

    async def session(self, history_json: bytes) -> str:
        self._check_not_stopping()
        self._session_uploads += 1
        if self._session_uploads > MAX_SESSION_UPLOADS:
            raise ChannelRefused(429, f"this run has handed its session back {MAX_SESSION_UPLOADS} times already")
        try:
            # Validating a few MB of JSON takes milliseconds to seconds: never on the event loop.
            self.session_json = await asyncio.to_thread(
                clean, history_json, self._session_max_messages, self.limits, self._spec.notes
            )
        except SessionRejected as exc:
            self.invalid(400, f"session not kept: {exc}")
            raise ChannelRefused(400, f"session not kept: {exc}") from None
        return "kept"

    async def model_step(self, body: bytes) -> bytes:
        self._check_not_stopping()
        if self._stepping:
            raise ChannelRefused(409, "one model step at a time: wait for the answer to the last one")
        allowed = self._spec.max_steps + EXTRA_MODEL_STEPS
        if self._model_steps >= allowed:
            raise ChannelRefused(
                429, f"this run has asked for {allowed} model steps; its limit is {self._spec.max_steps}"
            )
        self._model_steps += 1
        self._stepping = True
        try:
            return await self._make_step(body)
        finally:
            self._stepping = False

    async def _make_step(self, body: bytes) -> bytes:
        # pydantic-ai is loaded by the first step, not at start, and in a thread: its import takes 0.5 s.
        await asyncio.to_thread(importlib.import_module, "runner.channel.model_step")
        from runner.channel.model_step import StepFailed, make_step

        try:
            return await make_step(self._spec, self._socket_path, body, self.limits)
        except StepFailed as exc:
            log.info("model_step_failed", run_id=self._live.id, status=exc.status, reason=exc.reason)
            if exc.status == INVALID_STATUS:
                self.invalid(exc.status, exc.reason)
            raise ChannelRefused(exc.status, exc.reason) from None

    async def mcp_call(self, call: McpCall) -> str:
        self._check_not_stopping()
        if self.mcp is None:  # the agent's loop calls none then: a run that does is not that loop
            self.invalid(404, "this run was offered no MCP tools")
            raise ChannelRefused(404, "this run was offered no MCP tools")
        return await self.mcp.call(call)

    async def result(self, result: RunResult) -> str:
        self._check_live()
        if self.result_received is not None:
            raise ChannelRefused(409, "this run has reported its result already")
        self.result_received = result
        self.reported.set()
        return "received"
