"""Webhook mode's start, stop and health against the fake Bot API: setWebhook with the URL, the secret and the
allowed updates; a plain stop keeps it (Telegram queues for the next start); polling deletes it at its start
and gets what was pending; a webhook taken away surfaces as a receiving failure; a start that cannot listen or
is refused says why in one line."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from bot.channels.telegram import ALLOWED_UPDATES, TelegramChannel
from bot.channels.webhook import WebhookProblem
from bot.channels.webhook_guard import TELEGRAM_MAX_CONNECTIONS
from core.store.messages import MessageStore
from crewbot.startup import explain
from tests.bot.channels.webhook_helpers import SECRET, URL, message_update, post, webhook_settings
from tests.fakes.faults import Fault
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

WAIT_SECONDS = 10.0


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


async def test_start_sets_the_webhook_a_stop_keeps_it_and_polling_deletes_it(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        async with telegram_app(settings):
            [call] = tg.requests("setWebhook")
            assert call.params["url"] == URL and call.params["secret_token"] == SECRET
            assert json.loads(call.params["allowed_updates"]) == list(ALLOWED_UPDATES)
            assert call.params.get("drop_pending_updates") in (None, "False", "false", False)
            hook = tg.webhook
            assert (hook.url, hook.secret_token, hook.allowed_updates) == (URL, SECRET, list(ALLOWED_UPDATES))
            assert int(call.params["max_connections"]) == TELEGRAM_MAX_CONNECTIONS  # within the listener's cap
        # A plain stop leaves it set: what arrives now is kept for the next start.
        assert tg.webhook.url == URL and tg.webhook.history == [f"set {URL}"]
        tg.push_message(GROUP_ID, "sent while the bot was down")
        assert (await _webhook_info(tg))["pending_update_count"] == 1

        # Back to polling (no TELEGRAM_WEBHOOK_URL): the webhook is deleted, the pending update polled and stored.
        async with telegram_app(make_settings(tmp_path, tg)) as app:
            store = MessageStore(app.stores.db)

            async def polled() -> bool | None:
                return True if await store.count(GROUP_ID) else None

            await _until(polled)
            [message] = await store.recent(GROUP_ID, 5)
            assert message.content == "sent while the bot was down"
            assert tg.webhook.url == "" and tg.webhook.history == [f"set {URL}", "delete"]
            delete = tg.requests("deleteWebhook")[-1]
            assert delete.params.get("drop_pending_updates") in (None, "False", "false", False)


async def test_polling_is_refused_while_a_webhook_is_set_as_telegram_does(tmp_path: Path) -> None:
    async with FakeTelegram() as tg, aiohttp.ClientSession() as http:
        api = f"{tg.base_url}{tg.token}"
        async with http.post(f"{api}/setWebhook", json={"url": URL, "secret_token": SECRET}) as response:
            assert response.status == 200
        async with http.post(f"{api}/getUpdates", json={}) as response:
            assert response.status == 409
            assert "webhook is active" in (await response.json())["description"]


async def test_a_webhook_taken_away_is_a_receiving_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bot.channels.webhook_watch.WATCH_SECONDS", 0.05)
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        with structlog.testing.capture_logs() as logs:
            async with telegram_app(settings) as app, aiohttp.ClientSession() as http:
                channel = app.channel
                assert isinstance(channel, TelegramChannel)
                # Telegram reports a failed delivery (the proxy was down): logged once, receiving goes on.
                tg.set_webhook_error("Wrong response from the webhook: 502 Bad Gateway")
                await _until(lambda: _ready(events(logs, "webhook_delivery_failed")))
                await asyncio.sleep(0.2)
                [failed] = events(logs, "webhook_delivery_failed")
                assert failed["error"] == "Wrong response from the webhook: 502 Bad Gateway"
                assert channel.receiving_failure() is None

                # Another process with this token starts polling: it deletes the webhook.
                async with http.post(f"{tg.base_url}{tg.token}/deleteWebhook") as response:
                    assert response.status == 200
                failure = await asyncio.wait_for(channel.wait_receiving_failure(), WAIT_SECONDS)
                assert isinstance(failure, WebhookProblem)
                assert "Telegram no longer delivers to TELEGRAM_WEBHOOK_URL (its webhook is now unset" in str(failure)
                assert channel.receiving_failure() is failure
                # The listener still answers until the bot stops (it exits, and its supervisor restarts it).
                assert (await post(http, settings, message_update(tg, GROUP_ID, "late")))[0] == 200
        [stopped] = events(logs, "webhook_stopped")
        assert stopped["error_type"] == "WebhookProblem"


async def test_a_listen_address_in_use_fails_the_start_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with FakeTelegram() as tg:
            settings = webhook_settings(tmp_path, tg, TELEGRAM_WEBHOOK_LISTEN=f"127.0.0.1:{port}")
            with pytest.raises(WebhookProblem) as caught:
                async with telegram_app(settings):
                    pass
            assert tg.call_count("setWebhook") == 0  # nothing is asked of Telegram that the bot cannot serve
    line = explain(caught.value, settings)
    assert line.startswith(f"cannot listen on TELEGRAM_WEBHOOK_LISTEN=127.0.0.1:{port} (")
    assert line.endswith("stop what listens there, or choose another TELEGRAM_WEBHOOK_LISTEN and point the proxy at it")


async def test_a_webhook_telegram_refuses_fails_the_start_in_one_line(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = webhook_settings(tmp_path, tg)
        tg.fail_next("setWebhook", Fault.error(400, "Bad Request: bad webhook: Failed to resolve host"))
        with pytest.raises(WebhookProblem) as caught:
            async with telegram_app(settings):
                pass
    line = explain(caught.value, settings)
    assert line == (
        f"Telegram refused the webhook {URL} (Bad webhook: failed to resolve host): TELEGRAM_WEBHOOK_URL must be "
        "a public https:// address with a certificate Telegram trusts, on port 443, 80, 88 or 8443"
    )
    assert SECRET not in line
    # The listener was closed again (the leak guard would name a socket left listening).
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", int(settings.telegram_webhook_listen.rpartition(":")[2])))


def _ready(items: list[Any]) -> bool | None:
    return True if items else None


async def _until(probe: Any, timeout_seconds: float = WAIT_SECONDS) -> None:
    async with asyncio.timeout(timeout_seconds):
        while True:
            value = probe()
            if asyncio.iscoroutine(value):
                value = await value
            if value is not None:
                return
            await asyncio.sleep(0.02)


async def _webhook_info(tg: FakeTelegram) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.post(f"{tg.base_url}{tg.token}/getWebhookInfo") as response:
        result: dict[str, Any] = (await response.json())["result"]
        return result
