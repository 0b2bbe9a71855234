"""Watching one running container until it exits or must be stopped, and stopping it for sure.

A container is stopped when its run is cancelled, reaches SUBAGENT_TIMEOUT_SECONDS, spends its token
budget, fills its workspace past WORKSPACE_QUOTA_MB, or reports its result but does not exit. The first
reason wins (`LiveRun.request_stop`); the kill is asked again while the engine is away, so a run's slot
is free only once its container is confirmed stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from core.logging import get_logger
from runner.runs.live_runs import LiveRun, StopReason
from runner.runtimes.resource_use import RESOURCE_SAMPLE_SECONDS
from runner.runtimes.runtime import ContainerGone, ContainerRuntime, RuntimeUnavailable

log = get_logger(__name__)

ENGINE_RETRY_SECONDS = 2.0  # while the engine is unreachable, how often a run asks again
WORKSPACE_CHECK_SECONDS = 5.0  # how often a running run's workspace is measured against the quota
RESULT_GRACE_SECONDS = 10.0  # a container that reported its result gets this long to exit by itself
REMOVE_RETRY_SECONDS = 600.0  # a finished run's container removal waits this long for an engine that is away

OverQuota = Callable[[], Awaitable[str | None]]


class Supervisor:
    def __init__(self, runtime: ContainerRuntime, timeout_seconds: Callable[[], float]) -> None:
        self._runtime = runtime
        self._timeout_seconds = timeout_seconds  # read at each run's start: the operator may change it live

    async def until_exit(self, live: LiveRun, over_quota: OverQuota) -> int | None:
        """The container's exit code once it has exited or been stopped (None: it vanished); the reason
        it was stopped, if it was, is `live.stop_reason`."""
        exit_task = asyncio.create_task(self.wait_for_exit(live), name=f"wait-{live.id}")
        watchers = [
            asyncio.create_task(self._deadline(live)),
            asyncio.create_task(self._quota_watch(live, over_quota)),
            asyncio.create_task(self._linger_watch(live)),
            asyncio.create_task(self._sample_usage(live)),
        ]
        stop = asyncio.create_task(live.stop_requested.wait())
        try:
            await asyncio.wait({exit_task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not exit_task.done():
                await self.stop(live)
            return await exit_task
        finally:
            for task in [*watchers, stop, exit_task]:
                task.cancel()
            await asyncio.gather(*watchers, stop, return_exceptions=True)
            live.stopped = True

    async def wait_for_exit(self, live: LiveRun) -> int | None:
        """An engine that drops out meanwhile (a daemon restart) is waited for: the container keeps running."""
        assert live.container_id is not None
        while True:
            try:
                return await self._runtime.wait(live.container_id, None)
            except ContainerGone:
                return None
            except RuntimeUnavailable as exc:
                log.warning("engine_unreachable_while_waiting", run_id=live.id, error=str(exc))
                await asyncio.sleep(ENGINE_RETRY_SECONDS)

    def kill_soon(self, live: LiveRun) -> asyncio.Task[None]:
        """Ask the engine to kill the container now (one call, shared): a cancel and the supervisor's stop
        await the same kill, so the engine never gets a second one racing the first for the container."""
        assert live.container_id is not None
        if live.kill_task is None:
            live.kill_task = asyncio.create_task(self._runtime.kill(live.container_id), name=f"kill-{live.id}")
        return live.kill_task

    async def stop(self, live: LiveRun) -> None:
        """Kill it, asking again while the engine is away: its slot stays taken until this succeeds."""
        assert live.container_id is not None
        try:
            await asyncio.shield(self.kill_soon(live))
            return
        except RuntimeUnavailable as exc:
            log.error("container_not_killed", run_id=live.id, error=str(exc), retry_in_seconds=ENGINE_RETRY_SECONDS)
        while True:
            await asyncio.sleep(ENGINE_RETRY_SECONDS)
            try:
                await self._runtime.kill(live.container_id)
                return
            except RuntimeUnavailable as exc:
                log.error("container_not_killed", run_id=live.id, error=str(exc), retry_in_seconds=ENGINE_RETRY_SECONDS)

    async def remove(
        self, live: LiveRun, keep_logs: Callable[[str, bytes], Awaitable[None]], stopping: Callable[[], bool]
    ) -> None:
        """Keep its logs and remove it, asking again while the engine is away (a daemon restart), for up
        to REMOVE_RETRY_SECONDS; what is left then, the next start's recovery removes."""
        assert live.container_id is not None
        deadline = time.monotonic() + REMOVE_RETRY_SECONDS
        while True:
            try:
                await keep_logs(live.id, await self._runtime.logs(live.container_id))
                await self._runtime.remove(live.container_id)
                return
            except RuntimeUnavailable as exc:
                if stopping() or time.monotonic() > deadline:
                    log.warning("container_cleanup_failed", run_id=live.id, error=str(exc))
                    return
                await asyncio.sleep(ENGINE_RETRY_SECONDS)
            except Exception as exc:
                log.warning("container_cleanup_failed", run_id=live.id, error=str(exc))
                return

    async def _deadline(self, live: LiveRun) -> None:
        assert live.started_monotonic is not None
        elapsed = time.monotonic() - live.started_monotonic
        await asyncio.sleep(max(self._timeout_seconds() - elapsed, 0.0))
        live.request_stop(StopReason.TIME_LIMIT)

    async def _sample_usage(self, live: LiveRun) -> None:
        """Peak memory and CPU time while it runs: the engine forgets them once the container exits."""
        assert live.container_id is not None
        while True:
            try:
                sample = await self._runtime.usage(live.container_id)
            except Exception as exc:  # figures are a nice-to-have: never let them end a run
                log.debug("usage_sample_failed", run_id=live.id, error=str(exc))
                sample = None
            if sample is not None:
                live.usage.add(sample)
            await asyncio.sleep(RESOURCE_SAMPLE_SECONDS)

    async def _quota_watch(self, live: LiveRun, over_quota: OverQuota) -> None:
        while True:
            await asyncio.sleep(WORKSPACE_CHECK_SECONDS)
            if await over_quota() is not None:
                log.warning("workspace_over_quota", run_id=live.id, chat_id=live.chat_id)
                live.request_stop(StopReason.WORKSPACE_QUOTA)
                return

    async def _linger_watch(self, live: LiveRun) -> None:
        assert live.inbox is not None
        await live.inbox.reported.wait()
        await asyncio.sleep(RESULT_GRACE_SECONDS)
        live.request_stop(StopReason.LINGERING)
