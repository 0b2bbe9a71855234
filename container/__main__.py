"""`python -m container`: fetch the task over the run channel, run the subagent, report the result.

Exit code 0 when the run completed, 1 when it failed, 2 when the channel gave no usable task. Progress
lines go to stdout, which is the container's log.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from typing import Protocol

from container.channel import (
    BRIDGED_CONNECT_RETRY_DELAYS_SECONDS,
    CONNECT_RETRY_DELAYS_SECONDS,
    ChannelRefused,
    RunChannel,
    while_host_away,
)
from container.contract import CHANNEL_BRIDGED_ENV, POOLED_ENV
from container.paths import ContainerPaths
from container.run import describe_error, run_task
from container.task import RunResult, Task
from container.tool_specs import ToolSpec, tool_specs
from container.workspace_sync import PullState, pull_workspace, push_workspace, sync_enabled

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_BAD_TASK = 2
EXIT_SIGNALLED = 128 + signal.SIGTERM  # as a shell reports a process ended by SIGTERM
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ResultSink(Protocol):
    async def report(self, result: RunResult) -> str: ...


def log(line: str) -> None:
    print(f"crewbot-agent: {line}", flush=True)


def _exit_now(signum: int, frame: object) -> None:
    os._exit(EXIT_SIGNALLED)


async def _run_until_signal(
    task: Task, channel: RunChannel, paths: ContainerPaths, specs: dict[str, ToolSpec] | None = None
) -> RunResult:
    # As PID 1 the process ignores SIGTERM unless it handles it: stop the run and still report (unless main()
    # made SIGTERM an immediate exit: a bridged run is only ever signalled by its deletion).
    work = asyncio.create_task(run_task(task, channel, paths.workspace_dir, log, door=paths.egress_socket, specs=specs))
    loop = asyncio.get_running_loop()
    handle_signals = (
        threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is not _exit_now
    )
    if handle_signals:
        for stop_signal in STOP_SIGNALS:
            loop.add_signal_handler(stop_signal, work.cancel)
    try:
        return await work
    except asyncio.CancelledError:
        if not work.cancelled():
            raise
        return RunResult(status="failed", error="stopped by a signal")
    finally:
        if handle_signals:
            for stop_signal in STOP_SIGNALS:
                loop.remove_signal_handler(stop_signal)


async def run_main(
    paths: ContainerPaths, *, sync_workspace: bool = False, bridged: bool = False, pooled: bool = False
) -> int:
    """The whole run; returns the exit code. Awaitable in-process, which the tests do. With `sync_workspace`
    the workspace is pulled over the channel first and pushed back before the result (container/workspace_sync.py).
    `bridged`: the run socket is the bridge's (container/bridge.py), which the host starts just after the agent.
    `pooled`: a warm pool member, everything imported already, waiting on its channel until a run claims it."""
    delays = BRIDGED_CONNECT_RETRY_DELAYS_SECONDS if bridged else CONNECT_RETRY_DELAYS_SECONDS
    # The tools as offered depend on no task: read before it is asked for (a pool member's, before it waits),
    # so a run's first model step is not behind them.
    specs = tool_specs()
    async with RunChannel(paths.channel_socket, log, connect_delays_seconds=delays) as channel:
        try:
            task = await (_pooled_task(paths, bridged) if pooled else while_host_away(channel.task, "the task", log))
        except (ChannelRefused, OSError, ValueError) as exc:
            log(f"no usable task from the run channel: {describe_error(exc)}")
            return EXIT_BAD_TASK
        except Exception as exc:  # not expected (the channel raises the above), but still no task
            log(f"the run channel did not answer: {describe_error(exc)}")
            return EXIT_BAD_TASK
        log(f"run {task.run_id}: starting task {task.label!r}")
        result = (
            await _run_synced(task, channel, paths, specs)
            if sync_workspace
            else await _run_until_signal(task, channel, paths, specs)
        )
        if not await report(channel, result, task.run_id):
            return EXIT_FAILED
    if result.status == "completed":
        log(f"run {task.run_id}: completed ({result.input_tokens} in / {result.output_tokens} out tokens)")
        return EXIT_COMPLETED
    log(f"run {task.run_id}: failed: {result.error}")
    return EXIT_FAILED


async def _pooled_task(paths: ContainerPaths, bridged: bool) -> Task:
    """A warm pool member's task: one request on the socket the host bound before the container started, not
    tried again (a host that closed it drained the pool), waited for with no time limit until a run claims it.
    Bridged (a pod), the socket is the bridge's, which the host execs once the pod runs: it is waited for (a
    connection that fails sent nothing)."""
    delays = BRIDGED_CONNECT_RETRY_DELAYS_SECONDS if bridged else ()
    return await RunChannel(paths.channel_socket, log, connect_delays_seconds=delays).task(wait_seconds=None)


async def _run_synced(task: Task, channel: RunChannel, paths: ContainerPaths, specs: dict[str, ToolSpec]) -> RunResult:
    """The run between a pull and a push of its workspace. A failed pull ends it: pushing what it then made
    would replace the chat's stored workspace with a partial one. A stored workspace that could not be unpacked
    was set aside instead: the run starts empty, and its task says so."""

    def run_log(line: str) -> None:
        log(f"run {task.run_id}: {line}")

    pulled = await pull_workspace(channel, paths.workspace_dir, run_log)
    if pulled.state is PullState.FAILED:
        run_log(pulled.text)
        return RunResult(status="failed", error=pulled.text)
    result = await _run_until_signal(pulled.noted(task), channel, paths, specs)
    return await push_workspace(channel, paths.workspace_dir, result, run_log, pulled)


async def report(channel: ResultSink, result: RunResult, run_id: str) -> bool:
    """Hand the result over, waiting out a host that is restarting (its socket comes back): the host's
    time limit, not this loop, decides how long a finished run may wait. A refusal is final."""
    try:
        await while_host_away(lambda: channel.report(result), f"run {run_id}: the result", log)
    except Exception as exc:
        log(f"run {run_id}: the result could not be reported: {describe_error(exc)}")
        return False
    return True


def main() -> int:
    bridged = os.environ.get(CHANNEL_BRIDGED_ENV) == "1"
    if bridged:
        # A pod is signalled only when it is deleted (a cancel, its deadline): the host has decided and takes no
        # report, so PID 1 ends at once (its processes with it) instead of at the kubelet's SIGKILL 2 s later.
        signal.signal(signal.SIGTERM, _exit_now)
    paths = ContainerPaths.from_env(os.environ)
    pooled = os.environ.get(POOLED_ENV) == "1"
    return asyncio.run(run_main(paths, sync_workspace=sync_enabled(os.environ), bridged=bridged, pooled=pooled))


if __name__ == "__main__":
    sys.exit(main())
