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
    __slots__ = ("_max_connections",)

    def __init__(self, runner: web.AppRunner, path: str, *, max_connections: int = MAX_CONNECTIONS_PER_RUN) -> None:
        super().__init__(runner, path)
        self._max_connections = max_connections

    async def start(self) -> None:
        # As UnixSite.start, with a protocol factory that refuses connections over the cap.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) >= self._max_connections:
                return _Refused()
            return server()

        self._server = await asyncio.get_running_loop().create_unix_server(protocol, self._path, backlog=self._backlog)
