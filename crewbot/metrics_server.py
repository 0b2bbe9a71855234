"""Prometheus `/metrics`, and `/healthz` and `/readyz` for a process supervisor, on METRICS_ADDR.

Off unless METRICS_ADDR is set (e.g. `127.0.0.1:9464`). `/healthz` answers while the event loop does
(a stuck loop cannot answer); `/readyz` answers 200 once the bot has started and its database responds,
503 before that, while it stops, or once Telegram polling has stopped by itself (the process then exits).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from core.logging import get_logger

log = get_logger(__name__)

Readiness = Callable[[], Awaitable[str | None]]  # None: ready; else why not
Refresh = Callable[[], Awaitable[None]]  # gauges read from the store, updated before a scrape


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class MetricsServer:
    def __init__(
        self, registry: CollectorRegistry, addr: str, readiness: Readiness, refresh: Refresh | None = None
    ) -> None:
        self._registry = registry
        self._refresh = refresh
        self._host, self._port = split_addr(addr)
        self._readiness = readiness
        self._runner: web.AppRunner | None = None
        self.port: int | None = None  # the bound port (METRICS_ADDR may say 0: any free one)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        server = site._server  # aiohttp keeps the asyncio server here; it knows the real port
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else self._port
        log.info("metrics_listening", host=self._host, port=self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._refresh is not None:
            try:
                await self._refresh()
            except Exception:  # the other metrics still answer; the gauges keep their last values
                log.exception("metrics_refresh_failed")
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        why = await self._readiness()
        if why is None:
            return web.Response(text="ready\n")
        return web.Response(text=f"not ready: {why}\n", status=503)
