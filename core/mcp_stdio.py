"""The stdio transport of an MCP server, ours rather than the SDK's: every message the server writes is bounded.

The SDK's reader keeps an unterminated line growing without bound and re-joins its buffer at every chunk (time
quadratic in a line's length, on the event loop). Here stdout is read by asyncio's StreamReader (a search that
resumes where it stopped), a line longer than MAX_MESSAGE_BYTES ends the connection with a clear reason in
`Link.problem` (its in-flight calls fail with it; the next call starts the server again), and a long line is
parsed in a thread. The server's stderr is not the bot's: it is read here, each line cut and redacted of the
server's secrets, logged up to MAX_STDERR_LINES lines a connection, the rest read and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from core.logging import get_logger

log = get_logger(__name__)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # one JSON-RPC message from a server (a line on stdio, a body over HTTP); the
# SDK validates a message on the event loop (about 0.15 s a MiB here): this bounds that stall, and results are cut
# to MAX_RESULT_CHARS anyway
PARSE_IN_THREAD_BYTES = 64 * 1024  # a message longer than this is parsed off the event loop
MAX_STDERR_LINE_CHARS = 300  # of one stderr line in the log, after redaction
MAX_STDERR_LINES = 100  # logged per connection; the rest are read and dropped so the server never blocks
STDERR_CHUNK_BYTES = 4096
STOP_GRACE_SECONDS = 2.0  # after stdin closes, before SIGTERM; as long again before SIGKILL


@dataclass(slots=True)
class Link:
    """Why a connection's transport gave up (None: it did not): the reason a failed call names."""

    problem: str | None = None
    closed: bool = False  # the server's stdout ended (it exited, or was cut off): the connection is dead


@dataclass(frozen=True, slots=True)
class StdioCommand:
    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    server: str  # its name, for the log


def too_large(limit: int = MAX_MESSAGE_BYTES) -> str:
    return f"the server sent a message over {limit // (1024 * 1024)} MiB; its connection was closed"


@contextlib.asynccontextmanager
async def stdio_transport(
    command: StdioCommand, link: Link, redact: Callable[[str], str], max_message_bytes: int = MAX_MESSAGE_BYTES
) -> AsyncIterator[tuple[MemoryObjectReceiveStream[Any], MemoryObjectSendStream[Any]]]:
    """The server started with `command`; yields the (read, write) streams ClientSession takes."""
    from core.mcp_sdk import get_default_environment

    process = await asyncio.create_subprocess_exec(
        command.command,
        *command.args,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=get_default_environment() | dict(command.env),
        cwd=command.cwd,
        limit=max_message_bytes,  # StreamReader: readuntil gives up past this, and pauses the pipe at twice it
        start_new_session=True,  # its own process group: the server's children end with it
    )
    read_send, read_receive = anyio.create_memory_object_stream[Any](0)
    write_send, write_receive = anyio.create_memory_object_stream[Any](0)
    tasks = [
        asyncio.create_task(_read_stdout(process, read_send, link, max_message_bytes), name="mcp-stdout"),
        asyncio.create_task(_write_stdin(process, write_receive, read_send), name="mcp-stdin"),
        asyncio.create_task(_read_stderr(process, command.server, redact), name="mcp-stderr"),
    ]
    try:
        yield read_receive, write_send
    finally:
        await asyncio.shield(_stop(process, tasks, (read_send, read_receive, write_send, write_receive)))


async def _read_stdout(
    process: asyncio.subprocess.Process, out: MemoryObjectSendStream[Any], link: Link, limit: int
) -> None:
    from core.mcp_sdk import SessionMessage, jsonrpc_message_adapter

    assert process.stdout is not None
    try:
        while True:
            try:
                line = await process.stdout.readuntil(b"\n")
            except asyncio.IncompleteReadError as end:  # the server closed stdout: a last unterminated line
                line = end.partial
                if not line.strip():
                    return
            except asyncio.LimitOverrunError:
                link.problem = too_large(limit)
                log.warning("mcp_message_too_large", limit_bytes=limit)
                return
            if not line.strip():
                continue
            try:
                if len(line) > PARSE_IN_THREAD_BYTES:
                    message = await asyncio.to_thread(jsonrpc_message_adapter.validate_json, line, by_name=False)
                else:
                    message = jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValueError:
                continue  # junk a server printed to stdout: not a message, not fatal
            await out.send(SessionMessage(message))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
        return
    finally:
        link.closed = True
        out.close()  # the session sees the connection end: its waiting calls fail at once


async def _write_stdin(
    process: asyncio.subprocess.Process, messages: MemoryObjectReceiveStream[Any], reads: MemoryObjectSendStream[Any]
) -> None:
    assert process.stdin is not None
    try:
        async with messages:
            async for message in messages:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                process.stdin.write(data.encode() + b"\n")
                await process.stdin.drain()
    except (ConnectionError, OSError, anyio.ClosedResourceError, anyio.BrokenResourceError):
        reads.close()  # the server stopped reading: the session ends instead of a call waiting for ever


async def _read_stderr(process: asyncio.subprocess.Process, server: str, redact: Callable[[str], str]) -> None:
    """Bounded in memory (a line is kept up to STDERR_CHUNK_BYTES, the rest of it dropped) and in the log."""
    assert process.stderr is not None
    logged = 0

    def emit(line: bytes) -> None:
        nonlocal logged
        if logged < MAX_STDERR_LINES:
            text = redact(line.decode(errors="replace"))[:MAX_STDERR_LINE_CHARS]
            log.info("mcp_server_stderr", server=server, line=text)
        elif logged == MAX_STDERR_LINES:
            log.info("mcp_server_stderr_dropped", server=server, after_lines=MAX_STDERR_LINES)
        logged += 1

    pending = b""
    skipping = False  # the rest of a line logged in part: dropped, so no secret's tail starts a "line"
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await process.stderr.read(STDERR_CHUNK_BYTES):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if skipping:
                    skipping = False
                    continue
                emit(line)
            if len(pending) >= STDERR_CHUNK_BYTES:
                if not skipping:
                    emit(pending)
                pending, skipping = b"", True


async def _stop(
    process: asyncio.subprocess.Process, tasks: list[asyncio.Task[None]], streams: tuple[object, ...]
) -> None:
    """stdin closed (a server's cue to exit), then SIGTERM, then SIGKILL, to its whole process group. stdout is
    read and dropped meanwhile: a server blocked writing to it could not exit, and its pipe must reach its end
    for asyncio to close the process's transport."""
    tasks[0].cancel()  # the reader: it may wait for the session to take a message that no one will take now
    draining = asyncio.create_task(_drain(process.stdout), name="mcp-stdout-drain")
    if process.stdin is not None:
        process.stdin.close()
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
        try:
            async with asyncio.timeout(STOP_GRACE_SECONDS):
                await process.wait()
            break
        except TimeoutError:
            continue
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(STOP_GRACE_SECONDS):  # a child of the server may hold the pipe open
            await asyncio.gather(draining, *tasks[1:], return_exceptions=True)
    for task in (draining, *tasks):
        task.cancel()
    await asyncio.gather(draining, *tasks, return_exceptions=True)
    for stream in streams:
        stream.close()  # type: ignore[attr-defined]


async def _drain(stdout: asyncio.StreamReader | None) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while stdout is not None and await stdout.read(STDERR_CHUNK_BYTES * 16):
            pass
