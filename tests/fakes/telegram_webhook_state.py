"""The fake Telegram's webhook as setWebhook left it (its own module: TelegramData holds one)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MAX_CONNECTIONS = 40


@dataclass
class WebhookState:
    """What setWebhook set ("" url: none), and the last delivery error Telegram reports."""

    url: str = ""
    secret_token: str | None = None
    allowed_updates: list[str] | None = None
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    last_error_date: int | None = None
    last_error_message: str | None = None
    history: list[str] = field(default_factory=list)  # "set <url>" / "delete", in order
