"""What an operator reaches the running bot by: the control socket (live settings) and the metrics endpoint.

Built by `serve` around the app: the stored live overrides are applied before the app reads the settings,
the control socket and METRICS_ADDR open before the app starts (so /readyz can say "starting"), and both
close after it stops taking work. /readyz also fails once the channel stopped receiving by itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.channels.base import Channel, WatchedChannel
from core.live_config import LiveConfig
from core.logging import get_logger
from core.settings import Settings
from core.store.db import Database
from core.store.setting_overrides import SettingOverrideStore
from core.stores import Stores
from crewbot.control import ControlServer, control_socket_path
from crewbot.memory_stats import MemoryGauges
from crewbot.metrics_server import MetricsServer

if TYPE_CHECKING:
    from runner.lifecycle.metrics import RunMetrics

log = get_logger(__name__)


class Operations:
    def __init__(self, settings: Settings) -> None:
        from runner.lifecycle.metrics import RunMetrics

        self._settings = settings
        self.metrics: RunMetrics = RunMetrics()  # the app's own registry: no global state
        self.config: LiveConfig | None = None
        self.control: ControlServer | None = None
        self.server: MetricsServer | None = None
        self._db: Database | None = None
        self._channel: Channel | None = None
        self.ready = False

    async def open(self, stores: Stores) -> LiveConfig:
        self.config = LiveConfig(self._settings, SettingOverrideStore(stores.db))
        await self.config.load()
        return self.config

    async def start(self, db: Database, channel: Channel | None = None) -> None:
        self._db = db
        self._channel = channel
        assert self.config is not None
        self.control = ControlServer(self.config, control_socket_path(self._settings.data_dir))
        await self.control.start()
        if self._settings.metrics_addr:
            gauges = MemoryGauges(self.metrics.registry, db)  # notes and the history index, read at each scrape
            self.server = MetricsServer(
                self.metrics.registry, self._settings.metrics_addr, self._readiness, refresh=gauges.refresh
            )
            await self.server.start()

    async def _readiness(self) -> str | None:
        channel = self._channel
        failure = channel.receiving_failure() if isinstance(channel, WatchedChannel) else None
        if channel is not None and failure is not None:
            return f"{channel.name} stopped receiving messages ({type(failure).__name__}: {failure})"
        if not self.ready or self._db is None:
            return "starting or stopping"
        try:
            async with self._db.conn.execute("SELECT 1") as cursor:
                await cursor.fetchone()
        except Exception as exc:
            return f"database: {exc}"
        return None

    async def stop(self) -> None:
        for server in (self.server, self.control):
            if server is not None:
                try:
                    await server.stop()
                except Exception:
                    log.exception("operations_stop_failed")
        self.server = self.control = None
