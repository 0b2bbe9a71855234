"""The fake Bot API's webhook: setWebhook, deleteWebhook and getWebhookInfo as Telegram answers them, and
the test controls around them (what is set, a delivery error Telegram would report, the updates it would POST).

The fake never POSTs to the webhook itself: a test takes the pending updates (`take_pending_updates`) and POSTs
them to the bot's listener as Telegram would. While a webhook is set, getUpdates answers 409, as Telegram does.
"""

from __future__ import annotations

import copy
import re
import threading
from typing import Any
from urllib.parse import urlsplit

from tests.fakes.telegram_params import ApiError, Handler, Params, bad_request
from tests.fakes.telegram_state import JsonDict, TelegramData
from tests.fakes.telegram_webhook_state import DEFAULT_MAX_CONNECTIONS, WebhookState

WEBHOOK_PORTS = (443, 80, 88, 8443)
SECRET_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
WEBHOOK_ACTIVE = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"
)


class WebhookMethods:
    """setWebhook, deleteWebhook, getWebhookInfo over TelegramData's webhook state; every use holds `lock`."""

    def __init__(self, data: TelegramData, lock: threading.RLock) -> None:
        self._data = data
        self._lock = lock

    def handlers(self) -> dict[str, Handler]:
        return {
            "setWebhook": self.set_webhook,
            "deleteWebhook": self.delete_webhook,
            "getWebhookInfo": self.get_webhook_info,
        }

    async def set_webhook(self, params: Params) -> Any:
        url = params.string("url") or ""
        secret = params.string("secret_token")
        allowed = params.json("allowed_updates")
        if url:
            parts = urlsplit(url)
            if parts.scheme != "https":
                raise bad_request("bad webhook: An HTTPS URL must be provided for webhook")
            if parts.port is not None and parts.port not in WEBHOOK_PORTS:
                raise bad_request("bad webhook: Webhook can be set up only on ports 80, 88, 443 or 8443")
        if secret is not None and not SECRET_TOKEN.match(secret):
            raise bad_request("secret token contains unallowed characters")
        if allowed is not None and not isinstance(allowed, list):
            raise bad_request("can't parse allowed updates")
        with self._lock:
            hook = self._data.webhook
            if params.flag("drop_pending_updates"):
                self._data.updates.clear()
            hook.url = url
            hook.secret_token = secret
            hook.allowed_updates = None if allowed is None else [str(kind) for kind in allowed]
            hook.max_connections = params.integer("max_connections") or DEFAULT_MAX_CONNECTIONS
            hook.history.append(f"set {url}" if url else "delete")
        return True

    async def delete_webhook(self, params: Params) -> Any:
        with self._lock:
            if params.flag("drop_pending_updates"):
                self._data.updates.clear()
            hook = self._data.webhook
            hook.url, hook.secret_token, hook.allowed_updates = "", None, None
            hook.history.append("delete")
        return True

    async def get_webhook_info(self, params: Params) -> Any:
        with self._lock:
            hook = self._data.webhook
            info: JsonDict = {
                "url": hook.url,
                "has_custom_certificate": False,
                "pending_update_count": len(self._data.updates),
            }
            if hook.url:
                info["max_connections"] = hook.max_connections
                if hook.allowed_updates is not None:
                    info["allowed_updates"] = list(hook.allowed_updates)
            if hook.last_error_date is not None:
                info["last_error_date"] = hook.last_error_date
                info["last_error_message"] = hook.last_error_message
        return info

    def refuse_polling(self) -> None:
        """getUpdates while a webhook is set: 409, as Telegram answers. Call holding the lock."""
        if self._data.webhook.url:
            raise ApiError(409, WEBHOOK_ACTIVE)


class WebhookSide:
    """FakeTelegram's webhook controls; every read or write holds the fake's lock."""

    _lock: threading.RLock
    _data: TelegramData

    @property
    def webhook(self) -> WebhookState:
        """A copy of the webhook as set now."""
        with self._lock:
            return copy.deepcopy(self._data.webhook)

    def set_webhook_error(self, message: str, date: int | None = None) -> None:
        """Telegram failed to deliver (getWebhookInfo's last_error_message, last_error_date: now by default)."""
        with self._lock:
            self._data.webhook.last_error_message = message
            self._data.webhook.last_error_date = TelegramData.now() if date is None else date

    def take_pending_updates(self) -> list[JsonDict]:
        """Every update waiting, removed from the queue: what Telegram now POSTs to the webhook."""
        with self._lock:
            taken = [copy.deepcopy(update) for update in self._data.updates]
            self._data.updates.clear()
            return taken
