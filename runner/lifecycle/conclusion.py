"""A run's one outcome: which final status its end means, recorded with its `[Subagent]` message.

`RunStore.finish` records only the first outcome (a completion racing a cancel ends as one of them),
in the same transaction as the message the chat is owed; the message is then sent in the background.
A reported result is recorded as it arrives, not once the container has exited: on a busy engine the
exit is seen 100-300 ms later (bench: burst), and the chat need not wait for the teardown.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

from core.delivery import Delivery
from core.logging import get_logger
from core.settings import ResultMode, Settings
from core.store.chats import Chat
from core.store.run_files import Direction, RunFileStore
from core.store.runs import RunStatus, RunStore
from runner.channel.run_endpoint import MAX_INVALID_REQUESTS
from runner.lifecycle.manager_ports import TypingHolder
from runner.runs.live_runs import LiveRun, StopReason
from runner.runs.outcome import SUBAGENT_SENDER, files_sent_line, outcome_body, subagent_content
from runner.storage.run_files import RunFiles

log = get_logger(__name__)


class Releases:
    """A run's two releases: its hold on the chat's typing indicator, and its outcome closing its channel."""

    def __init__(self, typing: TypingHolder) -> None:
        self._typing = typing

    def release(self, live: LiveRun) -> None:
        """The run has its outcome: its channel closes to it, and its hold on the chat's typing goes, once."""
        if live.released:
            return
        live.released = True
        self.release_typing(live)

    def release_typing(self, live: LiveRun) -> None:
        """Only its hold on the chat's typing indicator, once: the chat has its result, its container may
        still be exiting."""
        if live.typing_released:
            return
        live.typing_released = True
        if not live.recovering:  # a run on hold from an earlier process never acquired it
            self._typing.release(live.chat_id)


class Conclusion:
    def __init__(
        self,
        settings: Settings,
        *,
        runs: RunStore,
        delivery: Delivery,
        files: RunFiles,
        releases: Releases,
        run_files: RunFileStore,
    ) -> None:
        self._settings = settings
        self._runs = runs
        self._run_files = run_files
        self._delivery = delivery
        self._files = files
        self._releases = releases

    @asynccontextmanager
    async def on_report(self, live: LiveRun, chat: Chat) -> AsyncIterator[None]:
        """While its container runs: a result it reports is recorded and sent at once."""
        task = asyncio.create_task(self._record_reported(live, chat), name=f"reported-{live.id}")
        try:
            yield
        finally:
            if live.inbox is None or not live.inbox.reported.is_set():
                task.cancel()  # it never reported: the exit decides
            await asyncio.gather(task, return_exceptions=True)  # a result being recorded is finished first

    async def _record_reported(self, live: LiveRun, chat: Chat) -> None:
        if live.inbox is None:
            return
        await live.inbox.reported.wait()
        if live.stop_reason is not None:
            return  # a stop asked for first (cancel, time limit, budget, quota) decides the outcome at the exit
        try:
            # Not released yet: until its container exits, the run's channel and gate stay as they were.
            live.result_recorded = await self._collect(live, chat, exit_code=None, release=False)
        except Exception:  # the exit's settle tries again
            log.exception("reported_result_not_recorded", run_id=live.id)
            return
        if live.result_recorded:
            # The chat has its result: a container slow to exit must not show it typing again afterwards.
            self._releases.release_typing(live)

    async def settle(self, live: LiveRun, chat: Chat, exit_code: int | None, quota_text: str | None) -> None:
        """The outcome of a run whose container has exited or was stopped (`live.stop_reason` says why)."""
        if live.result_recorded:
            self._releases.release(live)
            return
        reason = live.stop_reason
        if reason is StopReason.CANCELLED:
            return  # recorded when it was cancelled
        if reason is StopReason.TIME_LIMIT:
            limit = self._settings.subagent_timeout_seconds
            log.warning("run_timed_out", run_id=live.id, timeout_seconds=limit)
            await self.record(live, RunStatus.TIMED_OUT, error=f"timed out after {limit:g} s and was stopped")
        elif reason is StopReason.TOKEN_BUDGET:
            limit = self._settings.subagent_max_tokens
            error = f"used its token budget of {limit} tokens (SUBAGENT_MAX_TOKENS) and was stopped"
            await self.record(live, RunStatus.FAILED, error=error)
        elif reason is StopReason.DAILY_ALLOWANCE:
            # Not the run's fault: recorded interrupted (a scheduled task is not backed off for it), with the reason.
            spent = live.stop_detail or "the daily allowance of LLM tokens is used up"
            await self.record(live, RunStatus.INTERRUPTED, error=f"stopped: {spent}")
        elif reason is StopReason.INVALID_REQUESTS:
            error = f"sent {MAX_INVALID_REQUESTS} invalid requests on its channel and was stopped"
            await self.record(live, RunStatus.FAILED, error=error)
        elif reason is StopReason.WORKSPACE_QUOTA:
            await self.record(live, RunStatus.FAILED, error=quota_text or "its workspace is over WORKSPACE_QUOTA_MB")
        else:
            await self._collect(live, chat, exit_code)

    async def _collect(self, live: LiveRun, chat: Chat, exit_code: int | None, *, release: bool = True) -> bool:
        """Record what it reported (or that it reported nothing); whether this recorded the outcome."""
        result = live.inbox.result_received if live.inbox is not None else None
        if result is None:
            how = "vanished" if exit_code is None else f"exited with code {exit_code}"
            return await self.record(live, RunStatus.FAILED, error=f"{how} without reporting a result", release=release)
        if result.status == "failed":
            how = "without a reason" if exit_code is None else f"(exit code {exit_code})"
            return await self.record(live, RunStatus.FAILED, error=result.error or f"failed {how}", release=release)
        session_json = live.inbox.session_json if live.inbox is not None else None
        session_out = None
        if session_json is not None:  # kept only from a completed run
            await self._files.save_session(chat, live.id, session_json)
            session_out = live.id
        recorded = await self.record(
            live, RunStatus.COMPLETED, result=result.result or "(no output)", session_out=session_out, release=release
        )
        if recorded and session_out is not None:
            await self._runs.set_session(live.chat_id, session_out)
        return recorded

    async def record(
        self,
        live: LiveRun,
        status: str,
        *,
        result: str | None = None,
        error: str | None = None,
        session_out: str | None = None,
        release: bool = True,
    ) -> bool:
        """Record the run's one outcome with its [Subagent] message, then send that message."""
        body = outcome_body(status, result=result, error=error)
        # Only the files the host received and owes the chat: a result that claims others says so in its text.
        sent = [f for f in await self._run_files.of_run(live.id) if f.direction is Direction.OUT]
        if sent:
            body += "\n" + files_sent_line([(f.name, f.size_bytes) for f in sent])
        outgoing = self._delivery.outgoing(
            live.chat_id,
            subagent_content(live.label, body),
            kind="subagent",
            sender_name=SUBAGENT_SENDER,
            reply_to=await self._runs.asked_by(live.id),
        )
        outgoing = replace(outgoing, run_id=live.id)  # a reply to this message continues the run
        recorded = await self._runs.finish(
            live.id,
            status,
            result=result,
            error=error,
            session_out=session_out,
            outgoing=outgoing,
            deliver=self._settings.subagent_result_mode is ResultMode.DIRECT,  # announce: the main agent tells it
        )
        if not recorded:
            log.info("run_outcome_already_recorded", run_id=live.id, attempted=status)
            return False
        log.info("run_finished", run_id=live.id, status=status)
        if release:
            self._releases.release(live)
        self._delivery.send_soon(live.chat_id)
        return True
