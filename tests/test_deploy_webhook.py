"""The reverse-proxy examples under deploy/ agree with webhook mode's defaults: they serve the path of the
example TELEGRAM_WEBHOOK_URL, proxy it to the default TELEGRAM_WEBHOOK_LISTEN, refuse the rest, bound the body
no lower than the bot does, and leave the secret header alone."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bot.channels.webhook import MAX_BODY_BYTES, SECRET_HEADER
from core.setting_webhook import DEFAULT_WEBHOOK_LISTEN

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_URL = "https://bot.example.com/telegram"


@pytest.mark.parametrize(
    ("name", "route", "upstream", "body_limit"),
    [
        ("Caddyfile", r"handle (\S+) \{", r"reverse_proxy (\S+)", r"max_size (\d+)MiB"),
        ("nginx-webhook.conf", r"location = (\S+) \{", r"proxy_pass http://([^;/]+);", r"client_max_body_size (\d+)m;"),
    ],
)
def test_the_proxy_example_serves_the_webhook_path_to_the_default_listener(
    name: str, route: str, upstream: str, body_limit: str
) -> None:
    text = (ROOT / "deploy" / name).read_text(encoding="utf-8")
    config = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))

    assert re.findall(route, config) == [urlsplit(EXAMPLE_URL).path]
    assert re.findall(upstream, config) == [DEFAULT_WEBHOOK_LISTEN]
    assert int(re.findall(body_limit, config)[0]) * 1024 * 1024 >= MAX_BODY_BYTES
    assert "404" in config  # everything else is refused at the proxy
    assert f"TELEGRAM_WEBHOOK_URL={EXAMPLE_URL}" in text and f"TELEGRAM_WEBHOOK_LISTEN={DEFAULT_WEBHOOK_LISTEN}" in text
    assert SECRET_HEADER in text and "header_up" not in config and "proxy_set_header X-Telegram" not in config
