"""aiohttp sites that serve a bounded number of connections at once, on a Unix socket or on TCP.

Without a cap, whoever reaches a listener can open thousands of connections (or hold them half-sent) and take
the process's file descriptors, which the database, Telegram and the engine need for every chat. Connections
over the cap are closed as they arrive, before aiohttp makes anything for them. Users: a run's sockets
(runner/channel/capped_site.py) and the webhook listener (bot/channels/webhook_guard.py).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from aiohttp import web

Wrap = Callable[[asyncio.Protocol], asyncio.Protocol]  # around each admitted connection's handler
OnRefused = Callable[[], None]


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def capped_protocols(
    server: web.Server, max_connections: int, on_refused: OnRefused | None = None, wrap: Wrap | None = None
) -> Callable[[], asyncio.BaseProtocol]:
    """A protocol factory for the loop's server: aiohttp's handler, or one that closes the connection at once
    when `max_connections` are open (`on_refused` is told)."""
    loop = asyncio.get_running_loop()
    accepting = 0  # handlers made in this accept burst, not yet among the server's connections

    def burst_done() -> None:
        nonlocal accepting
        accepting = 0

    def protocol() -> asyncio.BaseProtocol:
        nonlocal accepting
        # The loop accepts a burst of connections at once and makes every handler before any of them is
        # connected (and counted in server.connections): the burst counts too, or 100 at once all get in.
        # `burst_done` runs after the burst's handlers are made and before they are connected.
        if len(server.connections) + accepting >= max_connections:
            if on_refused is not None:
                on_refused()
            return _Refused()
        if accepting == 0:
            loop.call_soon(burst_done)
        accepting += 1
        handler: asyncio.Protocol = server()
        return handler if wrap is None else wrap(handler)

    return protocol


class CappedUnixSite(web.UnixSite):
    __slots__ = ("_listening", "_max_connections", "_on_refused")

    def __init__(
        self,
        runner: web.BaseRunner,
        path: str,
        *,
        max_connections: int,
        on_refused: OnRefused | None = None,
        listening: socket.socket | None = None,
    ) -> None:
        """`listening`: a socket already bound (at `path`) and listening, served as it is: the connections waiting
        on it are accepted (a warm pool member's agent, connected before its run was known)."""
        super().__init__(runner, path)
        self._max_connections = max_connections
        self._on_refused = on_refused
        self._listening = listening

    async def start(self) -> None:
        # As UnixSite.start, with a protocol factory that refuses connections over the cap.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None  # the runner is set up before its sites start
        protocols = capped_protocols(server, self._max_connections, self._on_refused)
        loop = asyncio.get_running_loop()
        if self._listening is not None:
            self._server = await loop.create_unix_server(protocols, sock=self._listening, backlog=self._backlog)
        else:
            self._server = await loop.create_unix_server(protocols, self._path, backlog=self._backlog)


class CappedTCPSite(web.TCPSite):
    __slots__ = ("_max_connections", "_on_refused", "_wrap")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        max_connections: int,
        on_refused: OnRefused | None = None,
        wrap: Wrap | None = None,
    ) -> None:
        super().__init__(runner, host, port)
        self._max_connections = max_connections
        self._on_refused = on_refused
        self._wrap = wrap

    async def start(self) -> None:
        # As TCPSite.start (no TLS: a reverse proxy terminates it), with the capped protocol factory.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        protocols = capped_protocols(server, self._max_connections, self._on_refused, self._wrap)
        self._server = await asyncio.get_running_loop().create_server(
            protocols, self._host, self._port, backlog=self._backlog
        )
