"""The egress door's test rig: real servers on 127.0.0.1 only (a raw TCP echo server and an HTTP server),
a door on a Unix socket under tmp_path, its events as they are reported, and a client that speaks to the
socket as the container's forwarder passes a client's bytes: raw."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from core.egress_rules import EgressMode, IpAddress, parse_entry
from runner.egress.door import EgressDoor
from runner.egress.records import MAX_LOOKUPS_PER_RUN, EgressEvent, EgressRules

LOOPBACK = "127.0.0.1"
WAIT_SECONDS = 10.0  # for anything a test waits on: an answer, an event
PLENTY_BYTES = 64 * 1024 * 1024
HEAD_END = b"\r\n\r\n"


def rules(
    mode: EgressMode = EgressMode.ALLOWLIST,
    allow: Iterable[str] = (),
    *,
    max_bytes: int = PLENTY_BYTES,
    max_connections: int = 16,
    max_lookups: int = MAX_LOOKUPS_PER_RUN,
    chat_allow: Iterable[str] = (),
) -> EgressRules:
    return EgressRules(
        mode=mode,
        allow=tuple(parse_entry(entry) for entry in allow),
        max_bytes=max_bytes,
        max_connections=max_connections,
        max_lookups=max_lookups,
        chat_allow=tuple(parse_entry(entry) for entry in chat_allow),
    )


class Events:
    """The door's events, in order, and a way to wait for the next ones."""

    def __init__(self) -> None:
        self.seen: list[EgressEvent] = []
        self._taken = 0
        self._changed = asyncio.Event()

    def __call__(self, event: EgressEvent) -> None:
        self.seen.append(event)
        self._changed.set()

    async def wait_for(self, count: int) -> list[EgressEvent]:
        """The first `count` events, once there are that many."""
        async with asyncio.timeout(WAIT_SECONDS * 3):
            while len(self.seen) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.seen[:count]

    async def next(self) -> EgressEvent:
        """The event after those already taken by next() or counted by wait_for()."""
        self._taken += 1
        await self.wait_for(self._taken)
        return self.seen[self._taken - 1]


class FakeResolver:
    """Answers from a table, counting lookups: what a name server the test controls would say."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IpAddress]:
        self.calls.append(host)
        return [ipaddress.ip_address(text) for text in self.table[host]]


@dataclass
class EchoServer:
    """A raw TCP server on 127.0.0.1 that sends back every byte, and half-closes when its client does."""

    port: int = 0
    accepted: int = 0
    server: asyncio.Server | None = None
    handlers: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
            writer.write_eof()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            self.handlers.discard(task)

    async def settled(self) -> None:
        """Every connection it served has ended and its socket is closed (a tunnel's end reaches it over TCP,
        after the door has already closed its own side)."""
        if self.handlers:
            await asyncio.wait(set(self.handlers), timeout=WAIT_SECONDS)
        await asyncio.sleep(0)  # the closed transports' sockets close on the next turn of the loop


@asynccontextmanager
async def echo_server() -> AsyncIterator[EchoServer]:
    echo = EchoServer()
    echo.server = await asyncio.start_server(echo.handle, LOOPBACK, 0)
    echo.port = echo.server.sockets[0].getsockname()[1]
    try:
        yield echo
    finally:
        echo.server.close()
        for task in list(echo.handlers):
            task.cancel()
        await asyncio.gather(*echo.handlers, return_exceptions=True)
        await echo.server.wait_closed()


@dataclass
class WebServer:
    """An HTTP server on 127.0.0.1: /hello, /bytes/<n> (n bytes), POST /echo; it keeps each request's head."""

    port: int = 0
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # method, path+query, headers


@asynccontextmanager
async def web_server() -> AsyncIterator[WebServer]:
    seen = WebServer()

    async def keep(request: web.Request) -> None:
        seen.requests.append((request.method, request.path_qs, dict(request.headers)))

    async def hello(request: web.Request) -> web.Response:
        await keep(request)
        return web.Response(text="hello")

    async def some_bytes(request: web.Request) -> web.Response:
        await keep(request)
        return web.Response(body=b"x" * int(request.match_info["count"]))

    async def echo(request: web.Request) -> web.Response:
        await keep(request)
        return web.Response(body=await request.read())

    app = web.Application()
    app.router.add_get("/hello", hello)
    app.router.add_get("/bytes/{count}", some_bytes)
    app.router.add_post("/echo", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    try:
        await site.start()
        seen.port = runner.addresses[0][1]
        yield seen
    finally:
        await runner.cleanup()


@asynccontextmanager
async def open_door(
    path: Path, door_rules: EgressRules, events: Callable[[EgressEvent], None], **options: Any
) -> AsyncIterator[EgressDoor]:
    door = EgressDoor(path, door_rules, on_event=events, **options)
    await door.start()
    try:
        yield door
    finally:
        await door.close()


async def ask(path: Path, raw: bytes, *, close_after: bool = False) -> bytes:
    """What the door answers to `raw`, read to the end (b"" if it closed without a word). Read from the socket
    itself: a StreamReader that sees a reset raises it before the bytes that came first (a cut answer's)."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        got = bytearray()
        async with asyncio.timeout(WAIT_SECONDS):
            await loop.sock_connect(sock, str(path))
            with contextlib.suppress(ConnectionError):  # the door may refuse before it read everything
                await loop.sock_sendall(sock, raw)
                if close_after:
                    sock.shutdown(socket.SHUT_WR)
            with contextlib.suppress(ConnectionError):  # the kernel hands over what came before a reset first
                while chunk := await loop.sock_recv(sock, 65536):
                    got += chunk
        return bytes(got)


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    """Everything until the end of the stream, or until the other side reset it."""
    got = bytearray()
    try:
        while chunk := await reader.read(65536):
            got += chunk
    except ConnectionError:
        pass
    return bytes(got)


def status(answer: bytes) -> int:
    """The status code of an HTTP answer; 0 for none."""
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and answer.startswith(b"HTTP/1.") else 0


def body(answer: bytes) -> bytes:
    return answer.partition(HEAD_END)[2]


@asynccontextmanager
async def tunnel(path: Path, target: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A CONNECT tunnel to `target` through the door, its 200 read."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        async with asyncio.timeout(WAIT_SECONDS):
            head = await reader.readuntil(HEAD_END)
        assert head == b"HTTP/1.1 200 Connection established\r\n\r\n", head
        yield reader, writer
    finally:
        writer.close()


async def within(awaitable: Awaitable[Any], seconds: float = WAIT_SECONDS) -> Any:
    async with asyncio.timeout(seconds):
        return await awaitable


@asynccontextmanager
async def forwarder(path: Path) -> AsyncIterator[int]:
    """What the container runs: a loopback TCP port whose every connection is passed to the door unchanged.
    Yields the port, for clients (urllib, http.client) that speak to a proxy over TCP."""
    pipes: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.transport.abort()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        pipes.add(task)
        try:
            door_reader, door_writer = await asyncio.open_unix_connection(str(path))
            try:
                await asyncio.gather(pipe(client_reader, door_writer), pipe(door_reader, client_writer))
            finally:
                door_writer.close()
        finally:
            client_writer.close()
            pipes.discard(task)

    server = await asyncio.start_server(handle, LOOPBACK, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in list(pipes):
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        await server.wait_closed()
