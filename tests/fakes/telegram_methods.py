"""The Bot API methods the fake serves, with Telegram's validation and error descriptions: BotApi dispatches
every method and serves the bot's own (getMe, commands) and getUpdates; the webhook, chats and messages are
served by telegram_webhook, telegram_chat_methods, telegram_message_methods and telegram_file_methods."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.fakes.telegram_callback_methods import CallbackMethods
from tests.fakes.telegram_chat_methods import ChatMethods
from tests.fakes.telegram_file_methods import FileMethods
from tests.fakes.telegram_message_methods import MessageMethods
from tests.fakes.telegram_params import ApiError, Handler, Params, bad_request
from tests.fakes.telegram_state import MAX_UPDATES_PER_POLL, ApiCall, JsonDict, TelegramData
from tests.fakes.telegram_webhook import WebhookMethods
from tests.fakes.waiting import Watch

CONFLICT_DESCRIPTION = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
)


class _Conflict:
    """Marks a long poll that a newer getUpdates terminated."""


class BotApi:
    """Serves Bot API methods over TelegramData; every read or write holds `lock`."""

    def __init__(
        self,
        data: TelegramData,
        lock: threading.RLock,
        watch: Watch,
        *,
        strict_html: bool,
        closing: Callable[[], bool],
    ) -> None:
        self._data = data
        self._lock = lock
        self._watch = watch
        self._closing = closing
        self._webhook = WebhookMethods(data, lock)
        own: dict[str, Handler] = {
            **self._webhook.handlers(),  # setWebhook, deleteWebhook, getWebhookInfo
            "getMe": self.get_me,
            "getUpdates": self.get_updates,
            "setMyCommands": self.set_my_commands,
            "getMyCommands": self.get_my_commands,
            "deleteMyCommands": self.delete_my_commands,
        }
        chats = ChatMethods(data, lock).handlers()
        messages = MessageMethods(data, lock, watch, strict_html=strict_html).handlers()
        files = FileMethods(data, lock, watch, strict_html=strict_html).handlers()
        callbacks = CallbackMethods(data, lock, watch).handlers()
        self._handlers: dict[str, tuple[str, Handler]] = {
            name.lower(): (name, handler)
            for name, handler in {**own, **chats, **messages, **files, **callbacks}.items()
        }

    def canonical(self, method: str) -> str | None:
        """The method's canonical name; Telegram matches method names case-insensitively."""
        entry = self._handlers.get(method.lower())
        return entry[0] if entry else None

    def record_call(self, method: str, params: Params) -> None:
        with self._lock:
            self._data.calls.append(ApiCall(method, params.raw, time.monotonic()))
            self._data.call_counts[method] += 1
            self._watch.notify()

    async def call(self, method: str, params: Params) -> Any:
        entry = self._handlers.get(method.lower())
        if entry is None:
            raise ApiError(404, "Not Found")
        return await entry[1](params)

    # --- bot and webhook ------------------------------------------------------------------------

    async def get_me(self, params: Params) -> Any:
        return copy.deepcopy(self._data.bot_user)

    async def set_my_commands(self, params: Params) -> Any:
        commands = params.json("commands")
        if not isinstance(commands, list):
            raise bad_request('parameter "commands" is required')
        for command in commands:
            name = command.get("command", "") if isinstance(command, dict) else ""
            if not (1 <= len(name) <= 32) or not all(c.islower() or c.isdigit() or c == "_" for c in name):
                raise bad_request("BOT_COMMAND_INVALID")
            if not (1 <= len(command.get("description", "")) <= 256):
                raise bad_request("BOT_COMMAND_DESCRIPTION_INVALID")
        with self._lock:
            self._data.commands[self.commands_key(params)] = copy.deepcopy(commands)
        return True

    async def get_my_commands(self, params: Params) -> Any:
        with self._lock:
            return copy.deepcopy(self._data.commands.get(self.commands_key(params), []))

    async def delete_my_commands(self, params: Params) -> Any:
        with self._lock:
            self._data.commands.pop(self.commands_key(params), None)
        return True

    @staticmethod
    def commands_key(params: Params) -> tuple[str, str]:
        scope = params.json("scope") or {"type": "default"}
        return json.dumps(scope, sort_keys=True), params.string("language_code") or ""

    # --- updates --------------------------------------------------------------------------------

    async def get_updates(self, params: Params) -> Any:
        """Long polling: answers as soon as an update is pending, or after `timeout` seconds."""
        offset = params.integer("offset")
        limit = min(max(params.integer("limit") or MAX_UPDATES_PER_POLL, 1), MAX_UPDATES_PER_POLL)
        timeout_seconds = max(params.number("timeout") or 0.0, 0.0)
        with self._lock:
            self._webhook.refuse_polling()
            self._data.confirm(offset)
            self._data.poll_generation += 1
            generation = self._data.poll_generation
            self._watch.notify()  # an older poll still waiting now ends with 409

        def ready() -> list[JsonDict] | _Conflict | None:
            if self._data.poll_generation != generation:
                return _Conflict()
            updates = self._data.pending(limit)
            return updates if updates or self._closing() else None

        if timeout_seconds == 0:
            with self._lock:
                result = ready()
        else:
            try:
                result = await self._watch.wait_for(ready, timeout_seconds)
            except TimeoutError:
                result = []
        if isinstance(result, _Conflict):
            raise ApiError(409, CONFLICT_DESCRIPTION)
        return result or []
