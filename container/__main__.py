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
import time
from typing import Protocol

from container.channel import ChannelRefused, RunChannel
from container.paths import ContainerPaths
from container.protocol import RunResult, TaskSpec
from container.run import describe_error, run_task

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_BAD_TASK = 2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# A finished run keeps offering its result this long while the host is away (a restart, an upgrade).
REPORT_RETRY_SECONDS = 900.0
REPORT_FIRST_RETRY_SECONDS = 1.0
REPORT_MAX_RETRY_SECONDS = 30.0


class ResultSink(Protocol):
    async def report(self, result: RunResult) -> str: ...


def log(line: str) -> None:
    print(f"crewbot-agent: {line}", flush=True)


async def _run_until_signal(task: TaskSpec, channel: RunChannel, paths: ContainerPaths) -> RunResult:
    # As PID 1 the process ignores SIGTERM unless it handles it: stop the run and still report.
    work = asyncio.create_task(run_task(task, channel, paths.channel_socket, paths.workspace_dir, log))
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


async def run_main(paths: ContainerPaths) -> int:
    """The whole run; returns the exit code. Awaitable in-process, which the tests do."""
    async with RunChannel(paths.channel_socket) as channel:
        try:
            task = await channel.task()
        except (ChannelRefused, OSError, ValueError) as exc:
            log(f"no usable task from the run channel: {describe_error(exc)}")
            return EXIT_BAD_TASK
        except Exception as exc:  # not expected (the channel raises the above), but still no task
            log(f"the run channel did not answer: {describe_error(exc)}")
            return EXIT_BAD_TASK
        log(f"run {task.run_id}: starting task {task.label!r}")
        result = await _run_until_signal(task, channel, paths)
        if not await report(channel, result, task.run_id):
            return EXIT_FAILED
    if result.status == "completed":
        log(f"run {task.run_id}: completed ({result.input_tokens} in / {result.output_tokens} out tokens)")
        return EXIT_COMPLETED
    log(f"run {task.run_id}: failed: {result.error}")
    return EXIT_FAILED


async def report(channel: ResultSink, result: RunResult, run_id: str) -> bool:
    """Hand the result over, waiting out a host that is restarting (its socket comes back): the host's
    time limit, not this loop, decides how long a finished run may wait. A refusal is final."""
    deadline = time.monotonic() + REPORT_RETRY_SECONDS
    delay = REPORT_FIRST_RETRY_SECONDS
    while True:
        try:
            await channel.report(result)
            return True
        except ConnectionError as exc:
            if time.monotonic() + delay > deadline:
                log(f"run {run_id}: the result could not be reported: {describe_error(exc)}")
                return False
            log(f"run {run_id}: the host is not answering; trying again in {delay:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, REPORT_MAX_RETRY_SECONDS)
        except Exception as exc:
            log(f"run {run_id}: the result could not be reported: {describe_error(exc)}")
            return False


def main() -> int:
    return asyncio.run(run_main(ContainerPaths.from_env(os.environ)))


if __name__ == "__main__":
    sys.exit(main())
