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

from container.channel import ChannelRefused, RunChannel, while_host_away
from container.paths import ContainerPaths
from container.run import describe_error, run_task
from container.task import RunResult, Task
from container.workspace_sync import pull_workspace, push_workspace, sync_enabled

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_BAD_TASK = 2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ResultSink(Protocol):
    async def report(self, result: RunResult) -> str: ...


def log(line: str) -> None:
    print(f"crewbot-agent: {line}", flush=True)


async def _run_until_signal(task: Task, channel: RunChannel, paths: ContainerPaths) -> RunResult:
    # As PID 1 the process ignores SIGTERM unless it handles it: stop the run and still report.
    work = asyncio.create_task(run_task(task, channel, paths.workspace_dir, log, door=paths.egress_socket))
    loop = asyncio.get_running_loop()
    handle_signals = threading.current_thread() is threading.main_thread()
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


async def run_main(paths: ContainerPaths, *, sync_workspace: bool = False) -> int:
    """The whole run; returns the exit code. Awaitable in-process, which the tests do. With `sync_workspace`
    the workspace is pulled over the channel first and pushed back before the result (container/workspace_sync.py)."""
    async with RunChannel(paths.channel_socket, log) as channel:
        try:
            task = await while_host_away(channel.task, "the task", log)
        except (ChannelRefused, OSError, ValueError) as exc:
            log(f"no usable task from the run channel: {describe_error(exc)}")
            return EXIT_BAD_TASK
        except Exception as exc:  # not expected (the channel raises the above), but still no task
            log(f"the run channel did not answer: {describe_error(exc)}")
            return EXIT_BAD_TASK
        log(f"run {task.run_id}: starting task {task.label!r}")
        result = (
            await _run_synced(task, channel, paths) if sync_workspace else await _run_until_signal(task, channel, paths)
        )
        if not await report(channel, result, task.run_id):
            return EXIT_FAILED
    if result.status == "completed":
        log(f"run {task.run_id}: completed ({result.input_tokens} in / {result.output_tokens} out tokens)")
        return EXIT_COMPLETED
    log(f"run {task.run_id}: failed: {result.error}")
    return EXIT_FAILED


async def _run_synced(task: Task, channel: RunChannel, paths: ContainerPaths) -> RunResult:
    """The run between a pull and a push of its workspace. A failed pull ends it: pushing what it then made
    would replace the chat's stored workspace with a partial one."""

    def run_log(line: str) -> None:
        log(f"run {task.run_id}: {line}")

    failure = await pull_workspace(channel, paths.workspace_dir, run_log)
    if failure is not None:
        run_log(failure)
        return RunResult(status="failed", error=failure)
    result = await _run_until_signal(task, channel, paths)
    return await push_workspace(channel, paths.workspace_dir, result, run_log)


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
    return asyncio.run(run_main(ContainerPaths.from_env(os.environ), sync_workspace=sync_enabled(os.environ)))


if __name__ == "__main__":
    sys.exit(main())
