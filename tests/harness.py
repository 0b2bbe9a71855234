"""Builds the real app (real PTB, real SQLite, optionally real Docker) against the fakes at the edge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic_ai.models import Model

from bot.channels.telegram import TelegramChannel
from bot.channels.webhook import WebhookConfig
from core.mcp_servers import McpServers
from core.settings import Settings, load_settings
from core.stores import Stores
from crewbot.app import App
from crewbot.stream_record import CountStream
from tests.fakes.telegram_server import FakeTelegram

GROUP_ID = -1001
POLL_TIMEOUT_SECONDS = 1  # short long-polls keep shutdown quick in tests


def make_settings(data_dir: Path, tg: FakeTelegram | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "DATA_DIR": data_dir,
        "ALLOWED_CHAT_IDS": str(GROUP_ID),
        "LLM_PROVIDER": "offline",
        "TYPING_INTERVAL_SECONDS": 0.2,
        "MERGE_WINDOW_SECONDS": 0,
        # Tests count the chat's messages; the card is tested on its own (tests/bot/test_status_card.py).
        "STATUS_CARD": "false",
        # Tests count whole messages; streamed answers are tested on their own (tests/bot/agent/test_live_reply*.py).
        "STREAM_REPLIES": "false",
        "LOG_LEVEL": "DEBUG",
        "SUBAGENT_WARM_POOL": 0,  # the pool's own tests ask for one (tests/runner/test_warm_pool_e2e.py)
    }
    if tg is not None:
        values["TELEGRAM_BOT_TOKEN"] = tg.token
        values["TELEGRAM_API_BASE_URL"] = tg.base_url
    values.update(overrides)
    return load_settings(**values)


@asynccontextmanager
async def telegram_app(
    settings: Settings,
    *,
    model: Model | None = None,
    with_subagents: bool = False,
    count_stream: CountStream | None = None,
    mcp: McpServers | None = None,
) -> AsyncIterator[App]:
    stores = await Stores.open(settings)
    assert settings.telegram_bot_token is not None
    channel = TelegramChannel(
        settings.telegram_bot_token.get_secret_value(),
        settings.telegram_api_base_url,
        poll_timeout_seconds=POLL_TIMEOUT_SECONDS,
        webhook=WebhookConfig.of(settings),
    )
    factory = None
    if with_subagents:
        from crewbot.serve import unguarded
        from runner.service import build_subagent_system

        def factory_fn(delivery: Any, typing: Any) -> Any:
            system = build_subagent_system(settings, stores, delivery, typing, file_source=channel, mcp=mcp)
            return unguarded(settings, stores, system)

        factory = factory_fn
    app = App(settings, channel, stores, factory, model=model, count_stream=count_stream, mcp=mcp)
    try:
        await app.start()
    except BaseException:
        await app.stop()  # else the database thread keeps the test process alive
        raise
    try:
        yield app
    finally:
        await app.stop()
        if with_subagents:
            from runner.storage.paths import DataPaths
            from tests.runner.docker_helpers import remove_instance_containers

            await asyncio.to_thread(remove_instance_containers, DataPaths(settings.data_dir).instance_id)
