"""A run's Unix socket that serves a bounded number of connections at once (the site is core/capped_site.py's).

Without a cap, one container could open thousands of connections (or hold them half-sent) and take the
host's file descriptors, which the database, Telegram and the engine need for every chat. Connections over
the cap are closed as they arrive; the agent itself needs two or three.
"""

from __future__ import annotations

import socket

from aiohttp import web

from core import capped_site

MAX_CONNECTIONS_PER_RUN = 16


class CappedUnixSite(capped_site.CappedUnixSite):
    __slots__ = ()

    def __init__(
        self,
        runner: web.BaseRunner,
        path: str,
        *,
        max_connections: int = MAX_CONNECTIONS_PER_RUN,
        listening: socket.socket | None = None,
    ) -> None:
        super().__init__(runner, path, max_connections=max_connections, listening=listening)
