"""Webhook mode in tests: settings for it, and POSTs to the bot's listener as Telegram sends them."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import aiohttp

from core.settings import Settings
from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.telegram_state import JsonDict
from tests.harness import make_settings

SECRET = "test-webhook-secret_0123456789"
URL = "https://bot.example.test/telegram"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def webhook_settings(data_dir: Path, tg: FakeTelegram, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "TELEGRAM_WEBHOOK_URL": URL,
        "TELEGRAM_WEBHOOK_SECRET": SECRET,
        "TELEGRAM_WEBHOOK_LISTEN": f"127.0.0.1:{free_port()}",
    }
    values.update(overrides)
    return make_settings(data_dir, tg, **values)


def listener_url(settings: Settings, path: str = "/telegram") -> str:
    return f"http://{settings.telegram_webhook_listen}{path}"


async def post(
    http: aiohttp.ClientSession,
    settings: Settings,
    body: JsonDict | bytes,
    *,
    secret: str | None = SECRET,
    path: str = "/telegram",
) -> tuple[int, str]:
    """POST as Telegram does (JSON, the secret in its header); the status and the answer's text."""
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(listener_url(settings, path), data=data, headers=headers) as response:
        return response.status, await response.text()


def message_update(tg: FakeTelegram, chat_id: int, text: str) -> JsonDict:
    """A user's message as Telegram would POST it to the webhook (taken from the fake's queue)."""
    tg.push_message(chat_id, text)
    [update] = tg.take_pending_updates()
    return update
