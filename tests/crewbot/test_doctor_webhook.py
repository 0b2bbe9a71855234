"""`crewbot doctor`'s webhook line: getWebhookInfo (where Telegram delivers, pending updates, its last error)
read against the mode the settings ask for; a webhook in polling mode, another URL, or a fresh delivery error
fail with a fix. Against the fake Bot API; no Docker engine needed."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from crewbot.doctor import check_webhook, run_doctor
from crewbot.webhook_doctor import SECRET_FIX, TLS_FIX, WebhookFacts, webhook_verdict
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import make_settings

URL = "https://bot.example.test/telegram"
SECRET = "doctor-webhook-secret_0123456789"
LISTEN = "127.0.0.1:8443"
NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("facts", "wanted", "status", "detail"),
    [
        (WebhookFacts("", 0), None, "ok", "no webhook set: long polling (0 updates pending)"),
        (WebhookFacts("", 3), URL, "ok", f"no webhook set yet: `crewbot run` sets {URL} at start (3 updates pending)"),
        (WebhookFacts(URL, 1), URL, "ok", f"Telegram delivers to {URL} (1 update pending)"),
        (
            WebhookFacts(URL, 0, NOW - 3 * 86_400, "Wrong response from the webhook: 502 Bad Gateway"),
            URL,
            "ok",
            f"Telegram delivers to {URL} (0 updates pending; last error 3 days ago: Wrong response from the "
            "webhook: 502 Bad Gateway)",
        ),
        (
            WebhookFacts(URL, 7, NOW - 30, "Wrong response from the webhook: 502 Bad Gateway"),
            URL,
            "FAIL",
            f"Telegram cannot deliver to {URL} (7 updates pending; last error 30 s ago: Wrong response from the "
            "webhook: 502 Bad Gateway)",
        ),
        (
            WebhookFacts("https://other.example.test/hook", 2),
            URL,
            "FAIL",
            f"Telegram delivers to https://other.example.test/hook, not to TELEGRAM_WEBHOOK_URL {URL} "
            "(2 updates pending)",
        ),
        (
            WebhookFacts(URL, 4),
            None,
            "FAIL",
            f"a webhook is set ({URL}; 4 updates pending), so Telegram refuses getUpdates and polling gets nothing",
        ),
    ],
)
def test_the_verdict_for_each_case(facts: WebhookFacts, wanted: str | None, status: str, detail: str) -> None:
    got_status, got_detail, fix = webhook_verdict(facts, wanted, LISTEN, now=NOW)

    assert (got_status, got_detail) == (status, detail)
    assert (fix is not None) == (status == "FAIL")


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        ("Wrong response from the webhook: 403 Forbidden", SECRET_FIX),
        ("SSL error {error:0A000086:SSL routines::certificate verify failed}", TLS_FIX),
        ("Connection refused", "forwards the URL to TELEGRAM_WEBHOOK_LISTEN=127.0.0.1:8443 (deploy/Caddyfile"),
    ],
)
def test_a_fresh_delivery_error_names_its_fix(error: str, fix: str) -> None:
    _, _, got = webhook_verdict(WebhookFacts(URL, 1, NOW - 5, error), URL, LISTEN, now=NOW)

    assert got is not None and fix in got


async def _set_webhook(tg: FakeTelegram, url: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{tg.base_url}{tg.token}/setWebhook", json={"url": url}) as response,
    ):
        assert response.status == 200


async def test_polling_mode_with_a_webhook_set_fails_with_how_to_fix(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        assert (await check_webhook(settings)).status == "ok"
        await _set_webhook(tg, URL)
        tg.push_message(-1001, "waiting")

        result = await check_webhook(settings)

    assert result.status == "FAIL" and f"a webhook is set ({URL}; 1 update pending)" in result.detail
    assert result.fix is not None and "`crewbot run` deletes it at start (nothing pending is lost)" in result.fix


async def test_webhook_mode_shows_telegrams_last_error_and_the_secret_never(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, TELEGRAM_WEBHOOK_URL=URL, TELEGRAM_WEBHOOK_SECRET=SECRET)
        await _set_webhook(tg, URL)
        assert (await check_webhook(settings)).detail == f"Telegram delivers to {URL} (0 updates pending)"
        tg.set_webhook_error("Wrong response from the webhook: 403 Forbidden")

        async def prints_python(container: MemoryContainer) -> int | None:
            container.logs = b"3.11.2\n"
            return 0

        lines: list[str] = []
        async with MemoryRuntime(images={"crewbot-agent:latest"}, on_start=prints_python) as runtime:
            code = await run_doctor(settings, out=lines.append, runtime=runtime)

    assert code == 1
    [line] = [line for line in lines if line.split()[1] == "webhook"]
    assert line.startswith(f"FAIL webhook   Telegram cannot deliver to {URL} (0 updates pending; last error ")
    assert line.endswith(f"Wrong response from the webhook: 403 Forbidden); fix: {SECRET_FIX}")
    assert not any(SECRET in line for line in lines)


async def test_no_token_skips_and_a_failed_telegram_check_skips_the_webhook(tmp_path: Path) -> None:
    assert (await check_webhook(make_settings(tmp_path / "none"))).status == "skip"
    async with FakeTelegram(token="123:right") as tg:
        settings = make_settings(tmp_path / "wrong", tg, TELEGRAM_BOT_TOKEN="123:wrong-token")
        lines: list[str] = []
        async with MemoryRuntime(images=set()) as runtime:
            await run_doctor(settings, out=lines.append, runtime=runtime)
    [line] = [line for line in lines if line.split()[1] == "webhook"]
    assert line == "skip webhook   not checked: the Telegram check failed"
