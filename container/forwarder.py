"""The loopback forwarder: the container's way to the door (`EGRESS_SOCKET_FILE`), the host's web proxy.

The container has no network but loopback. While a run with egress lasts, this listens on 127.0.0.1 (a port the
kernel picks) and the bash tool's commands get it as their HTTP(S) proxy (`shell_environment`), so curl, pip,
git and urllib reach the web with no flags. Each connection accepted here gets a new connection to the door and
the bytes go both ways unchanged: nothing is parsed here, the host reads each request (a proxy request, or
CONNECT for HTTPS) and decides. When one side ends its sending, the other side's sending is shut down (a
half-close passes through); the connection is closed once both have ended, or at once when either breaks.

A door that is missing or refuses is answered `HTTP/1.1 502 Bad Gateway` with a one-line body saying so (the
client's request is then read and dropped for a moment, so closing does not reset the answer away). Past
`max_connections` at once, a new connection is closed at once, unanswered. The bytes go by `container.splice`:
two threads a connection moving them through a pipe (no copy into Python, and this loop is not on their path);
each direction holds one pipe of PIPE_BYTES at a time. `close()` ends every connection and the listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from container.splice import SpliceRelay

LOOPBACK = "127.0.0.1"  # never a wider address: nothing outside the container may use the door
MAX_CONNECTIONS = 64
LISTEN_BACKLOG = 128
CHUNK_BYTES = 64 * 1024  # what a refused client's request is read and dropped by
DOOR_CONNECT_SECONDS = 10.0  # a door whose backlog is full does not refuse: it makes connect wait
ACCEPT_RETRY_SECONDS = 0.1  # after an accept that failed (no file descriptors left, say)
REFUSAL_LINGER_SECONDS = 2.0  # after a 502: how long the client's request is read and dropped before closing
MAX_LOGGED_FAILURES = 5  # lines on doors not reachable and accepts that failed: then one saying there are more
# The variables the bash tool's commands get with egress (curl reads http_proxy only in lower case), and none
# of them without it.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
NO_PROXY_VARIABLES = ("NO_PROXY", "no_proxy")  # empty with egress: loopback goes to the door too


def shell_environment(base: Mapping[str, str], proxy_url: str | None) -> dict[str, str]:
    """The environment of a command: `base` without proxy variables; with `proxy_url`, every proxy variable
    set to it and NO_PROXY empty (all traffic goes to the door, loopback included)."""
    env = {name: value for name, value in base.items() if name not in PROXY_VARIABLES}
    if proxy_url is not None:
        env.update(dict.fromkeys(PROXY_VARIABLES, proxy_url))
        env.update(dict.fromkeys(NO_PROXY_VARIABLES, ""))
    return env


def _silent(line: str) -> None:
    """No log."""


class Forwarder:
    """`async with Forwarder(door) as forwarder:` listens on `forwarder.url` until the block ends."""

    def __init__(
        self, door: Path, *, max_connections: int = MAX_CONNECTIONS, log: Callable[[str], None] = _silent
    ) -> None:
        self._door = door
        self._max_connections = max_connections
        self._log = log
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        # Each accepted socket with its connection's task, from the accept on: a task cancelled before it ran
        # never closes its socket, so close() does.
        self._open: dict[asyncio.Task[None], socket.socket] = {}
        self._failures = 0

    async def __aenter__(self) -> Forwarder:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the forwarder is not listening")
        port: int = self._listener.getsockname()[1]
        return port

    @property
    def url(self) -> str:
        """The proxy URL the commands get: `http://127.0.0.1:<port>`."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._open)

    async def start(self) -> int:
        """Listen on a loopback port the kernel picks; returns it."""
        if self._listener is not None:
            raise RuntimeError("the forwarder is listening already")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setblocking(False)
            listener.bind((LOOPBACK, 0))
            listener.listen(LISTEN_BACKLOG)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept(listener))
        return self.port

    async def settle(self) -> None:
        """Wait until the connections open now have ended."""
        if self._open:
            await asyncio.wait(list(self._open))

    async def close(self) -> None:
        """Stop listening and end every connection at once; nothing is left open."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        tasks = list(self._open)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in self._open.values():
            client.close()
        self._open.clear()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of file descriptors, say: the next accept may work
                self._failed(f"a connection was not accepted: {exc}")
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            if len(self._open) >= self._max_connections:
                client.close()  # over the limit: closed at once, unanswered
                continue
            # No await between the accept and here: the socket is registered before anything can cancel us.
            task = asyncio.create_task(self._serve(client))
            self._open[task] = client
            task.add_done_callback(self._forget)

    def _failed(self, line: str) -> None:
        self._failures += 1
        if self._failures <= MAX_LOGGED_FAILURES:
            self._log(f"egress: {line}")
        elif self._failures == MAX_LOGGED_FAILURES + 1:
            self._log("egress: more failures; not logged")

    def _forget(self, task: asyncio.Task[None]) -> None:
        client = self._open.pop(task, None)
        if client is not None:
            client.close()
        if not task.cancelled() and task.exception() is not None:
            self._failed(f"a connection failed: {task.exception()!r}")

    async def _serve(self, client: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        door = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            door.setblocking(False)
            try:
                async with asyncio.timeout(DOOR_CONNECT_SECONDS):
                    await loop.sock_connect(door, os.fspath(self._door))
            except (OSError, TimeoutError) as exc:
                await self._refuse(client, _why(exc))
                return
            await SpliceRelay(client, door).run()
        finally:
            door.close()
            client.close()

    async def _refuse(self, client: socket.socket, why: str) -> None:
        """Answer 502 with `why`, send nothing more, and read the request for a moment so the answer is not lost to
        a reset when the socket closes with unread bytes."""
        self._failed(f"the door is not reachable: {why}")
        body = f"crewbot: the web proxy of this run is not reachable ({why})\n".encode()
        head = (
            "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(REFUSAL_LINGER_SECONDS):
                await loop.sock_sendall(client, head + body)
                client.shutdown(socket.SHUT_WR)
                while await loop.sock_recv(client, CHUNK_BYTES):
                    pass


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"it did not accept within {DOOR_CONNECT_SECONDS:g} s"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return type(exc).__name__
