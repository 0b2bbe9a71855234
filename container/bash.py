"""Run one shell command with a time limit and bounded output; the `bash` tool's engine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from container.output import OutputCollector

READ_CHUNK_BYTES = 65_536
# After the shell exits, background jobs may still hold its stdout open; wait this long for them.
BACKGROUND_DRAIN_SECONDS = 0.5
KILL_REAP_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class CommandResult:
    output: str  # stdout and stderr merged, capped
    exit_code: int | None  # None when the command was killed at the time limit
    timed_out: bool
    output_detached: bool  # background processes still held the output when the shell exited
    total_output_chars: int

    def render(self, timeout_seconds: float) -> str:
        """The text the model sees: the output, then one line on how the command ended."""
        lines = [self.output.rstrip("\n")] if self.output else ["(no output)"]
        if self.timed_out:
            lines.append(f"[command timed out after {timeout_seconds:g} s; its process group was killed]")
        else:
            lines.append(f"[exit code: {self.exit_code}]")
        if self.output_detached:
            lines.append("[background processes kept running; their later output is not shown]")
        return "\n".join(lines)


async def run_command(
    command: str, *, cwd: Path, timeout_seconds: float, output_cap_chars: int, env: Mapping[str, str] | None = None
) -> CommandResult:
    """Run `command` with `bash -c` in its own process group; kill the whole group at the time limit. `env` is
    the command's whole environment (None: this process's)."""
    # Our own pipe rather than asyncio's: its wait() also waits for the pipe to close, which a
    # background job may hold open for ever, and we must be able to close our end when we stop reading.
    read_fd, write_fd = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,  # its own process group, so a timeout kills its children too
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    collector = OutputCollector(output_cap_chars)
    stream = asyncio.StreamReader()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(stream), os.fdopen(read_fd, "rb", buffering=0)
    )
    reader = asyncio.create_task(_drain(stream, collector))
    timed_out = False
    output_detached = False
    try:
        await asyncio.wait_for(process.wait(), timeout=timeout_seconds)
    except TimeoutError:
        timed_out = True
        _kill_group(process.pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), timeout=KILL_REAP_SECONDS)
    except asyncio.CancelledError:
        _kill_group(process.pid)
        reader.cancel()
        transport.close()
        raise
    try:
        done, _ = await asyncio.wait({reader}, timeout=BACKGROUND_DRAIN_SECONDS)
        if not done:
            # Leave deliberate background jobs running; only stop listening to them.
            output_detached = not timed_out
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
    finally:
        transport.close()
    return CommandResult(
        output=collector.text(),
        exit_code=None if timed_out else process.returncode,
        timed_out=timed_out,
        output_detached=output_detached,
        total_output_chars=collector.total_chars,
    )


async def _drain(stream: asyncio.StreamReader, collector: OutputCollector) -> None:
    while chunk := await stream.read(READ_CHUNK_BYTES):
        collector.feed(chunk)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
