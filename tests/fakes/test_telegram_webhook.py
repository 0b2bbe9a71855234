"""The fake Bot API's webhook methods answer as Telegram does, and its controls show what is set."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.fakes.telegram_server import FakeTelegram

URL = "https://bot.example.test/telegram"
SECRET = "a-secret_0123456789"


async def call(tg: FakeTelegram, method: str, **params: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(f"{tg.base_url}{tg.token}/{method}", json=params) as response:
        return response.status, await response.json()


async def test_set_get_and_delete_the_webhook() -> None:
    async with FakeTelegram() as tg:
        assert (await call(tg, "getWebhookInfo"))[1]["result"] == {
            "url": "",
            "has_custom_certificate": False,
            "pending_update_count": 0,
        }
        status, _ = await call(tg, "setWebhook", url=URL, secret_token=SECRET, allowed_updates=["message"])
        assert status == 200
        tg.push_message(-1001, "waiting for delivery")
        tg.set_webhook_error("Wrong response from the webhook: 502 Bad Gateway", date=1_700_000_000)

        info = (await call(tg, "getWebhookInfo"))[1]["result"]
        assert info["url"] == URL and info["pending_update_count"] == 1 and info["allowed_updates"] == ["message"]
        assert info["max_connections"] == 40
        assert (info["last_error_date"], info["last_error_message"]) == (
            1_700_000_000,
            "Wrong response from the webhook: 502 Bad Gateway",
        )
        assert "secret_token" not in info  # Telegram never shows it
        assert (tg.webhook.url, tg.webhook.secret_token) == (URL, SECRET)

        [update] = tg.take_pending_updates()  # what Telegram would POST now
        assert update["message"]["text"] == "waiting for delivery" and tg.pending_updates() == []

        tg.push_message(-1001, "kept")
        assert (await call(tg, "deleteWebhook"))[0] == 200
        assert tg.webhook.url == "" and len(tg.pending_updates()) == 1
        assert (await call(tg, "deleteWebhook", drop_pending_updates=True))[0] == 200
        assert tg.pending_updates() == [] and tg.webhook.history == [f"set {URL}", "delete", "delete"]


async def test_get_updates_is_refused_while_a_webhook_is_set() -> None:
    async with FakeTelegram() as tg:
        await call(tg, "setWebhook", url=URL)
        status, body = await call(tg, "getUpdates")
        assert status == 409 and "can't use getUpdates method while webhook is active" in body["description"]
        await call(tg, "setWebhook", url="")  # an empty URL removes it, as Telegram's does
        assert (await call(tg, "getUpdates"))[0] == 200


async def test_a_webhook_telegram_would_refuse_is_refused() -> None:
    async with FakeTelegram() as tg:
        for params, description in [
            ({"url": "http://bot.example.test/telegram"}, "An HTTPS URL must be provided"),
            ({"url": "https://bot.example.test:9443/telegram"}, "only on ports 80, 88, 443 or 8443"),
            ({"url": URL, "secret_token": "no spaces allowed"}, "secret token contains unallowed characters"),
        ]:
            status, body = await call(tg, "setWebhook", **params)
            assert status == 400 and description in body["description"]
        assert tg.webhook.url == ""
