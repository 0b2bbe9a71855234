"""The webhook settings' types (TELEGRAM_WEBHOOK_URL, _LISTEN, _SECRET), each checked as Telegram would take it.

A URL set is webhook mode; then the secret is required (Telegram sends it with every update, and it is all
that tells Telegram's POSTs from anyone else's). Only https:// URLs: Telegram delivers webhooks over TLS only,
so an http:// one would fail at setWebhook anyway (the tests POST to the listener directly, they need none).
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, SecretStr, ValidationInfo

DEFAULT_WEBHOOK_LISTEN = "127.0.0.1:8443"
MAX_TCP_PORT = 65535
WEBHOOK_PORTS = (443, 80, 88, 8443)  # the only ports Telegram delivers webhooks to
# Telegram's shape for secret_token is 1-256 of these; at least 16 here: the log redactor leaves secrets under
# 6 characters alone, and a short one is guessed.
WEBHOOK_SECRET_SHAPE = re.compile(r"[A-Za-z0-9_-]{16,256}")
URL_FIELD = "telegram_webhook_url"


def _blank_is_none(value: object) -> object:
    return (value.strip() or None) if isinstance(value, str) else value


def check_webhook_url(url: str | None) -> str | None:
    """A URL Telegram accepts for a webhook: https (it delivers over TLS only), a host, one of its ports."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme != "https" or not parts.hostname or parts.fragment:
        raise ValueError("must be the public https:// URL Telegram posts to, e.g. https://bot.example.com/telegram")
    if port is not None and port not in WEBHOOK_PORTS:
        raise ValueError(f"must use port 443, 80, 88 or 8443 (the ones Telegram delivers to), not {port}")
    return url


def host_port(value: str) -> tuple[str, int]:
    """`HOST:PORT` (an IPv6 host in brackets) as (host, port); ValueError naming the form otherwise."""
    host, colon, port = value.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= MAX_TCP_PORT:
        raise ValueError("must be HOST:PORT with a port from 1 to 65535, e.g. 127.0.0.1:8443")
    return host, int(port)


def _check_listen(value: str) -> str:
    host_port(value)
    return value.strip()


def _check_secret(value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
    """Telegram's shape; required once a URL is set (checked here, after the URL: fields go in order)."""
    if value is None:
        if info.data.get(URL_FIELD) is not None:
            raise ValueError(
                "required when TELEGRAM_WEBHOOK_URL is set (Telegram sends it with every update; "
                "e.g. `openssl rand -hex 32`)"
            )
        return None
    if not WEBHOOK_SECRET_SHAPE.fullmatch(value.get_secret_value()):
        raise ValueError("must be 16 to 256 letters, digits, _ or - (e.g. the output of `openssl rand -hex 32`)")
    return value


WebhookUrl = Annotated[str | None, BeforeValidator(_blank_is_none), AfterValidator(check_webhook_url)]
WebhookListen = Annotated[str, AfterValidator(_check_listen)]
# Give it `validate_default=True`: an absent secret is checked too (required with a URL).
WebhookSecret = Annotated[SecretStr | None, BeforeValidator(_blank_is_none), AfterValidator(_check_secret)]
