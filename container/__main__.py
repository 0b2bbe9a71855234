"""`python -m container`: read task.json, run the subagent, write result.json as the last act.

Exit code 0 when the run completed, 1 when it failed, 2 when task.json is unusable. Progress lines go
to stdout, which is the container's log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from pathlib import Path

from pydantic import ValidationError

from container.paths import ContainerPaths
from container.protocol import RunResult, TaskSpec, write_json_atomic
from container.run import run_task

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_BAD_TASK = 2
UNKNOWN_RUN_ID = "unknown"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TaskFileError(Exception):
    """task.json is missing, not JSON, or not a TaskSpec."""

    def __init__(self, message: str, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


def log(line: str) -> None:
    print(f"crewbot-agent: {line}", flush=True)


def load_task(path: Path) -> TaskSpec:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TaskFileError(f"{path.name} cannot be read: {exc.strerror or exc}", UNKNOWN_RUN_ID) from exc
    try:
        return TaskSpec.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise TaskFileError(
            f"{path.name} is not a valid task: {where}: {first['msg']} ({exc.error_count()} errors)",
            _salvage_run_id(raw),
        ) from exc


def _salvage_run_id(raw: bytes) -> str:
    # A task that fails validation may still name its run; the host matches the result by it.
    try:
        data = json.loads(raw)
    except ValueError:
        return UNKNOWN_RUN_ID
    run_id = data.get("run_id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) and run_id else UNKNOWN_RUN_ID


async def _run_until_signal(task: TaskSpec, paths: ContainerPaths) -> RunResult:
    # As PID 1 the process ignores SIGTERM unless it handles it: stop the run and still report.
    work = asyncio.create_task(run_task(task, paths, log))
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
        return RunResult(run_id=task.run_id, status="failed", error="stopped by a signal")
    finally:
        if handle_signals:
            for stop_signal in STOP_SIGNALS:
                loop.remove_signal_handler(stop_signal)


async def run_main(paths: ContainerPaths) -> int:
    """The whole run; returns the exit code. Awaitable in-process, which the tests do."""
    try:
        task = load_task(paths.task_file)
    except TaskFileError as exc:
        log(f"unusable task: {exc}")
        _report(paths, RunResult(run_id=exc.run_id, status="failed", error=f"unusable task: {exc}"))
        return EXIT_BAD_TASK
    log(f"run {task.run_id}: starting task {task.label!r}")
    result = await _run_until_signal(task, paths)
    if not _report(paths, result):
        return EXIT_FAILED
    if result.status == "completed":
        log(f"run {task.run_id}: completed ({result.input_tokens} in / {result.output_tokens} out tokens)")
        return EXIT_COMPLETED
    log(f"run {task.run_id}: failed: {result.error}")
    return EXIT_FAILED


def _report(paths: ContainerPaths, result: RunResult) -> bool:
    """Write result.json; False (and a log line) when the run dir does not take it."""
    try:
        write_json_atomic(paths.result_file, result)
    except OSError as exc:
        log(f"cannot write {paths.result_file}: {exc.strerror or exc}")
        return False
    return True


def main() -> int:
    return asyncio.run(run_main(ContainerPaths.from_env(os.environ)))


if __name__ == "__main__":
    sys.exit(main())
