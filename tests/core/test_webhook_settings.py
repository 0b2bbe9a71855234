"""Webhook settings: the mode switch (a URL set is webhook mode), and bad values refused in one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.setting_webhook import DEFAULT_WEBHOOK_LISTEN, host_port
from core.settings import SettingsError, load_settings

SECRET = "0123456789abcdef_-XYZ"


@pytest.fixture(autouse=True)
def _no_dotenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_polling_is_the_default() -> None:
    s = load_settings()

    assert s.telegram_webhook_url is None and s.telegram_webhook_secret is None
    assert s.telegram_webhook_listen == DEFAULT_WEBHOOK_LISTEN == "127.0.0.1:8443"


def test_a_url_with_its_secret_is_webhook_mode() -> None:
    s = load_settings(
        TELEGRAM_WEBHOOK_URL="https://bot.example.com:8443/telegram",
        TELEGRAM_WEBHOOK_SECRET=SECRET,
        TELEGRAM_WEBHOOK_LISTEN=" [::1]:9000 ",
    )

    assert s.telegram_webhook_url == "https://bot.example.com:8443/telegram"
    assert s.telegram_webhook_secret is not None and s.telegram_webhook_secret.get_secret_value() == SECRET
    assert host_port(s.telegram_webhook_listen) == ("::1", 9000)


def test_blank_values_are_polling() -> None:
    s = load_settings(TELEGRAM_WEBHOOK_URL="  ", TELEGRAM_WEBHOOK_SECRET="")

    assert s.telegram_webhook_url is None and s.telegram_webhook_secret is None


def test_the_secret_is_required_with_a_url() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(TELEGRAM_WEBHOOK_URL="https://bot.example.com/telegram")

    assert caught.value.lines == [
        "invalid setting TELEGRAM_WEBHOOK_SECRET: required when TELEGRAM_WEBHOOK_URL is set (Telegram sends it with "
        "every update; e.g. `openssl rand -hex 32`)"
    ]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://bot.example.com/telegram", "https://"),
        ("http://127.0.0.1:8443/telegram", "https://"),
        ("bot.example.com/telegram", "https://"),
        ("https:///telegram", "https://"),
        ("https://bot.example.com/telegram#x", "https://"),
        ("https://bot.example.com:9443/telegram", "port 443, 80, 88 or 8443"),
        ("https://bot.example.com:port/telegram", "https://"),
    ],
)
def test_a_url_telegram_would_refuse_is_refused_at_start(url: str, why: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(TELEGRAM_WEBHOOK_URL=url, TELEGRAM_WEBHOOK_SECRET=SECRET)

    [line] = caught.value.lines
    assert line.startswith("invalid setting TELEGRAM_WEBHOOK_URL: must") and why in line


@pytest.mark.parametrize(
    "secret", ["short", "x" * 257, "has space in it 0123", "punctuation!0123456789", "ünïcode0123456789"]
)
def test_a_secret_outside_telegrams_shape_is_refused_and_never_shown(secret: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(TELEGRAM_WEBHOOK_URL="https://bot.example.com/telegram", TELEGRAM_WEBHOOK_SECRET=secret)

    [line] = caught.value.lines
    assert line.startswith("invalid setting TELEGRAM_WEBHOOK_SECRET: must be 16 to 256 letters, digits, _ or -")
    assert secret not in line


@pytest.mark.parametrize("listen", ["8443", "127.0.0.1", ":8443", "127.0.0.1:0", "127.0.0.1:65536", "host:x"])
def test_a_listen_address_not_host_port_is_refused(listen: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(TELEGRAM_WEBHOOK_LISTEN=listen)

    [line] = caught.value.lines
    assert line.startswith("invalid setting TELEGRAM_WEBHOOK_LISTEN: must be HOST:PORT with a port from 1 to 65535")
