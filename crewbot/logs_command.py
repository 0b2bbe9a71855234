"""`crewbot logs <run id>`: what a subagent run has printed so far, the files it was given and sent, and its
connections through the egress door, without reaching for `docker logs` or the database."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, TextIO

from bot.run_output import ContainerLogs, RunOutput, describe_state
from bot.run_web import LOGS_CONNECTIONS
from core.settings import Settings
from core.store.db import Database
from core.store.runs import FINAL_STATUSES
from crewbot.startup import StartupError

if TYPE_CHECKING:
    from runner.runtimes.runtime import ContainerRuntime

FOLLOW_INTERVAL_SECONDS = 1.0  # --follow looks for new output this often
FOLLOW_TAIL_CHARS = 1_000_000  # --follow compares whole outputs up to this size to find what is new


def _heading(output: RunOutput, shown_chars: int) -> str:
    record = output.record
    state = describe_state(record, time.time())
    if output.problem is not None:
        return f"run {record.id} ({record.label}): {state}; no output to show: {output.problem}"
    cut = "" if output.total_chars <= shown_chars else f"; the last {shown_chars:,} characters"
    return f"run {record.id} ({record.label}): {state}{cut}"


def _print_heading(output: RunOutput, shown_chars: int, stream: TextIO) -> None:
    """`== run ... ==`, then the files it was given and sent (one line per direction) and its web totals and latest
    connections (one a line), each when it has any."""
    print(f"== {_heading(output, shown_chars)} ==", file=stream)
    for line in output.extra_lines:
        print(f"== {line} ==", file=stream)


async def show_logs(
    settings: Settings,
    run_id: str,
    tail_chars: int,
    *,
    follow: bool = False,
    out: TextIO | None = None,
    runtime: ContainerLogs | None = None,
    interval_seconds: float = FOLLOW_INTERVAL_SECONDS,
) -> int:
    """Print the run's output (the tail); with `follow`, then what it prints next, until it ends."""
    from crewbot.serve import output_reader, subagent_runtime

    stream = out or sys.stdout
    db = await Database.open(settings.db_path)
    owned: ContainerRuntime | None = None
    if runtime is None:
        owned = runtime = subagent_runtime(settings)
    try:
        reader = output_reader(settings, db, runtime)
        # Following compares whole outputs to find what is new, so it reads more than it first shows.
        wanted = max(tail_chars, FOLLOW_TAIL_CHARS) if follow else tail_chars
        output = await reader.read(run_id.strip(), wanted, LOGS_CONNECTIONS)
        if output is None:
            raise StartupError(f"no run {run_id!r} in {settings.db_path}", "the chat's /subagents lists run ids")
        shown = output.text[-tail_chars:]
        _print_heading(output, len(shown), stream)
        stream.write(shown if shown.endswith("\n") or not shown else shown + "\n")
        stream.flush()
        seen = output.text
        while follow and output.record.status not in FINAL_STATUSES:
            await asyncio.sleep(interval_seconds)
            latest = await reader.read(output.record.id, FOLLOW_TAIL_CHARS, LOGS_CONNECTIONS)
            if latest is None:
                break
            output = latest
            new = output.text[len(seen) :] if output.text.startswith(seen) else output.text[-tail_chars:]
            if new:
                stream.write(new)
                stream.flush()
            seen = output.text
        if follow:
            _print_heading(output, len(output.text), stream)
        return 0
    finally:
        if owned is not None:
            await owned.close()
        await db.close()
