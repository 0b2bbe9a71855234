"""A run's Unix socket that serves a bounded number of connections at once.

Without a cap, one container could open thousands of connections (or hold them half-sent) and take the
host's file descriptors, which the database, Telegram and the engine need for every chat. Connections over
the cap are closed as they arrive; the agent itself needs two or three.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

MAX_CONNECTIONS_PER_RUN = 16


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class CappedUnixSite(web.UnixSite):
    __slots__ = ("_accepting", "_max_connections")

    def __init__(self, runner: web.AppRunner, path: str, *, max_connections: int = MAX_CONNECTIONS_PER_RUN) -> None:
        super().__init__(runner, path)
        self._max_connections = max_connections
        self._accepting = 0  # handlers made in this accept batch, not yet among the server's connections

    async def start(self) -> None:
        # As UnixSite.start, with a protocol factory that refuses connections over the cap.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()

        def batch_done() -> None:
            self._accepting = 0

        def protocol() -> asyncio.BaseProtocol:
            # The loop accepts a burst of connections at once and makes every handler before any of them is
            # connected (and counted in server.connections): the burst counts too, or 100 at once all get in.
            # `batch_done` runs after the burst's handlers are made and before they are connected.
            if len(server.connections) + self._accepting >= self._max_connections:
                return _Refused()
            if self._accepting == 0:
                loop.call_soon(batch_done)
            self._accepting += 1
            return server()

        self._server = await asyncio.get_running_loop().create_unix_server(protocol, self._path, backlog=self._backlog)
