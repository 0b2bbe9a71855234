"""Fake doors for the loopback forwarder's tests: a Unix socket server standing in for the host's web proxy,
with handlers that echo, answer after the client's end, hold, or proxy (just enough of HTTP for curl and
urllib), and a tiny origin HTTP server on loopback for the proxy to reach."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

CHUNK = 64 * 1024
SOCKET_MODE = 0o666
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class FakeDoor:
    """A Unix socket server at `path` serving each connection with `handler`; counts what it accepts and the
    handlers that returned, and ends every connection it still has when the block ends."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.accepted = 0
        self.handled = 0
        self._handler = handler
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeDoor:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        os.chmod(self.path, SOCKET_MODE)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.transport.abort()
        await self._server.wait_closed()
        self.path.unlink(missing_ok=True)

    async def wait_accepted(self, count: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.accepted >= count)

    async def wait_handled(self, count: int) -> None:
        """Until `count` handlers returned: what they read is complete (the block's end would cut them)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.handled >= count)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        async with self._changed:
            self.accepted += 1
            self._changed.notify_all()
        try:
            await self._handler(reader, writer)
            async with self._changed:
                self.handled += 1
                self._changed.notify_all()
            writer.close()  # what the handler wrote is sent first
            await writer.wait_closed()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()
            self._writers.discard(writer)
            self._tasks.discard(task)


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Each byte back as it comes; the end of the client's sending ends the door's."""
    while chunk := await reader.read(CHUNK):
        writer.write(chunk)
        await writer.drain()
    writer.write_eof()
    await writer.drain()


async def count_after_end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers only once the client has ended its sending: how many bytes it sent."""
    data = await reader.read()
    writer.write(f"got {len(data)} bytes".encode())
    await writer.drain()
    writer.write_eof()


def exchange(payload: bytes, received: list[bytes]) -> Handler:
    """Sends `payload` while it reads what the client sends (into `received`), both until their ends."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def send() -> None:
            writer.write(payload)
            await writer.drain()
            writer.write_eof()

        sending = asyncio.create_task(send())
        try:
            received.append(await reader.read())
        finally:
            await sending

    return handler


def greet_first(received: list[bytes]) -> Handler:
    """Says hello and ends its sending at once, then reads what the client sends until its end."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello from the door")
        await writer.drain()
        writer.write_eof()
        received.append(await reader.read())

    return handler


async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keeps the connection until the client ends its sending."""
    await reader.read()


def http_proxy(seen: list[str]) -> Handler:
    """Just enough of an HTTP proxy: a request in absolute form goes, its head as it is, to the loopback port it
    names, and the bytes are relayed both ways; `seen` gets each request line."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line = head.split(b"\r\n", 1)[0].decode()
        seen.append(request_line)
        url = urlsplit(request_line.split()[1])
        if url.hostname != "127.0.0.1" or url.port is None:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            return
        origin_reader, origin_writer = await asyncio.open_connection("127.0.0.1", url.port)
        try:
            origin_writer.write(head)
            await asyncio.gather(_copy(reader, origin_writer), _copy(origin_reader, writer))
        finally:
            origin_writer.transport.abort()

    return handler


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while chunk := await reader.read(CHUNK):
        writer.write(chunk)
        await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()


class Origin:
    """A tiny HTTP server on 127.0.0.1: every request gets `body`, then the connection closes; `targets` records
    the request targets it got."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.targets: list[str] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Origin:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.targets.append(head.split(b"\r\n", 1)[0].decode().split()[1])
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                + f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n".encode()
                + self.body
            )
            writer.close()
            await writer.wait_closed()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()
            self._tasks.discard(task)
