"""The real bridge process (`python -m container.bridge`) as a test's byte stream, and the socket helpers shared by
the mux, bridge and pod bridge tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from container.contract import BRIDGE_MODULE, BRIDGE_TARGET_RUN
from container.mux import LocalConnection, Sink
from container.paths import CHANNEL_SOCKET_ENV
from container.protocol import CHANNEL_SOCKET_FILE

REPO_ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 60.0  # generous: a loaded machine starts Python slowly
EXIT_SECONDS = 10.0
PIPE_LIMIT_BYTES = 256 * 1024
STDERR_LINES = 100


class BridgeProcess:
    """`python -m container.bridge` on a channel folder, its stdin and stdout a byte stream (the PodBridge's
    ByteStream); its stderr lines are kept, and `listening` is set when it says it listens."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None and process.stdin is not None
        self.process = process
        self.stderr_lines: list[str] = []
        self.listening = asyncio.Event()
        self._stderr = asyncio.create_task(self._read_stderr())

    @classmethod
    async def start(cls, channel_dir: Path, *, egress: bool = False) -> BridgeProcess:
        environ = {
            **os.environ,
            CHANNEL_SOCKET_ENV: str(channel_dir / CHANNEL_SOCKET_FILE),
            "PYTHONPATH": str(REPO_ROOT),
        }
        argv = [sys.executable, "-P", "-m", BRIDGE_MODULE, *(["--egress"] if egress else [])]
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=channel_dir,
            env=environ,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=PIPE_LIMIT_BYTES,
        )
        return cls(process)

    @property
    def reader(self) -> asyncio.StreamReader:
        assert self.process.stdout is not None
        return self.process.stdout

    async def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def wait_listening(self) -> None:
        async with asyncio.timeout(START_SECONDS):
            await self.listening.wait()

    async def close(self) -> None:
        """End its stdin (the host goes away) and wait for it to exit; kill it if it does not."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        with contextlib.suppress(OSError):
            await self.process.stdin.wait_closed()
        try:
            async with asyncio.timeout(EXIT_SECONDS):
                await self.process.wait()
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        await self._stderr

    def kill(self) -> None:
        """The exec stream breaks: the process dies at once."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def describe(self) -> str:
        return f"exit {self.process.returncode}; stderr: {' | '.join(self.stderr_lines[-3:])}"

    async def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        while line := await self.process.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            if len(self.stderr_lines) < STDERR_LINES:
                self.stderr_lines.append(text)
            if "listening on" in text:
                self.listening.set()


@contextlib.asynccontextmanager
async def unix_server(
    path: Path, handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
) -> AsyncIterator[list[asyncio.StreamWriter]]:
    """A raw Unix server running `handle` per connection; yields the connections' writers, all closed at the end."""
    writers: list[asyncio.StreamWriter] = []
    tasks: set[asyncio.Task[None]] = set()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handle(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_unix_server(accepted, os.fspath(path))
    try:
        yield writers
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Everything read is written back; the end of reading ends writing (a half-close passes through)."""
    while data := await reader.read(64 * 1024):
        writer.write(data)
        await writer.drain()
    writer.write_eof()
    await writer.drain()


async def read_all(reader: asyncio.StreamReader) -> bytes:
    chunks = []
    while data := await reader.read(1024 * 1024):
        chunks.append(data)
    return b"".join(chunks)


@dataclass
class HostSocket:
    path: Path
    live: int = 0
    accepted: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    stall: asyncio.Event = field(default_factory=asyncio.Event)  # set: the handler starts reading
    handed_out: list[asyncio.StreamWriter] = field(default_factory=list)

    async def wait(self, predicate: Callable[[HostSocket], bool]) -> None:
        async with asyncio.timeout(START_SECONDS):
            while not predicate(self):
                self.changed.clear()
                await self.changed.wait()

    async def connect(self, target: str) -> LocalConnection | None:
        if target != BRIDGE_TARGET_RUN:
            return None
        connection = await asyncio.open_unix_connection(os.fspath(self.path))
        self.handed_out.append(connection[1])
        return connection

    def all_closed(self) -> bool:
        """Every connection the mux was given is closed (or closing) on its side."""
        return all(writer.transport.is_closing() for writer in self.handed_out)


@contextlib.asynccontextmanager
async def counting_echo_server(path: Path) -> AsyncIterator[HostSocket]:
    """An echo server on `path` that counts its connections (and waits for `stall` before it reads, when a test
    clears it); its `connect` is a host side mux's connector to it (the run target only)."""
    state = HostSocket(path)
    state.stall.set()
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        writers.append(writer)
        state.live += 1
        state.accepted += 1
        state.changed.set()
        try:
            await state.stall.wait()
            await echo(reader, writer)
        except OSError:
            pass
        finally:
            writer.close()
            state.live -= 1
            state.changed.set()

    server = await asyncio.start_unix_server(accepted, os.fspath(state.path))
    yield state
    server.close()
    state.stall.set()
    for writer in writers:
        writer.transport.abort()  # a handler still reading sees the end (cancelling it would log an error)
    await asyncio.gather(*tasks, return_exceptions=True)
    await server.wait_closed()


async def stream_pair() -> tuple[LocalConnection, LocalConnection]:
    a, b = socket.socketpair()
    return await asyncio.open_connection(sock=a), await asyncio.open_connection(sock=b)


def sink_of(writer: asyncio.StreamWriter) -> Sink:
    async def sink(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    return sink
