"""The Bot API methods the fake serves, with Telegram's validation and error descriptions."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tests.fakes.telegram_state import (
    MAX_UPDATES_PER_POLL,
    ApiCall,
    ChatAction,
    JsonDict,
    SentMessage,
    TelegramData,
)
from tests.fakes.telegram_text import MAX_MESSAGE_TEXT_CHARS, EntityParseError, ParsedText, parse_text
from tests.fakes.waiting import Watch

CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
CONFLICT_DESCRIPTION = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
)
NOT_MODIFIED_DESCRIPTION = (
    "message is not modified: specified new message content and reply markup of the "
    "message are exactly the same as a current content and reply markup of the message"
)


class ApiError(Exception):
    """A Bot API error answer: HTTP status = error_code."""

    def __init__(self, status: int, description: str, parameters: JsonDict | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters

    def body(self) -> JsonDict:
        body: JsonDict = {"ok": False, "error_code": self.status, "description": self.description}
        if self.parameters:
            body["parameters"] = self.parameters
        return body


def bad_request(reason: str) -> ApiError:
    return ApiError(400, f"Bad Request: {reason}")


class Params:
    """Typed reads of request parameters: form values arrive as strings, JSON bodies keep types."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = dict(raw)

    def string(self, name: str) -> str | None:
        value = self.raw.get(name)
        if value is None or isinstance(value, str):
            return value
        return json.dumps(value) if isinstance(value, dict | list | bool) else str(value)

    def integer(self, name: str) -> int | None:
        value = self.raw.get(name)
        if value is None or value == "":
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return int(str(value).strip())
        except ValueError:
            raise bad_request(f"invalid {name} specified") from None

    def number(self, name: str) -> float | None:
        value = self.raw.get(name)
        if value is None or value == "":
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise bad_request(f"invalid {name} specified") from None

    def flag(self, name: str) -> bool:
        value = self.raw.get(name)
        if isinstance(value, str):
            return value.strip().lower() in ("true", "1")
        return bool(value)

    def json(self, name: str) -> Any:
        """A nested object: a JSON string in forms (how PTB sends it), native in JSON bodies."""
        value = self.raw.get(name)
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError:
            raise bad_request(f"can't parse {name} JSON object") from None


class _Conflict:
    """Marks a long poll that a newer getUpdates terminated."""


Handler = Callable[[Params], Awaitable[Any]]


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
        self._strict_html = strict_html
        self._closing = closing
        self._handlers: dict[str, tuple[str, Handler]] = {
            name.lower(): (name, handler)
            for name, handler in {
                "getMe": self.get_me,
                "getUpdates": self.get_updates,
                "deleteWebhook": self.delete_webhook,
                "getWebhookInfo": self.get_webhook_info,
                "setMyCommands": self.set_my_commands,
                "getMyCommands": self.get_my_commands,
                "deleteMyCommands": self.delete_my_commands,
                "getChat": self.get_chat,
                "getChatMember": self.get_chat_member,
                "getChatAdministrators": self.get_chat_administrators,
                "sendMessage": self.send_message,
                "sendChatAction": self.send_chat_action,
                "editMessageText": self.edit_message_text,
                "deleteMessage": self.delete_message,
            }.items()
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

    async def delete_webhook(self, params: Params) -> Any:
        if params.flag("drop_pending_updates"):
            with self._lock:
                self._data.updates.clear()
        return True

    async def get_webhook_info(self, params: Params) -> Any:
        with self._lock:
            pending = len(self._data.updates)
        return {"url": "", "has_custom_certificate": False, "pending_update_count": pending}

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

    # --- chats ----------------------------------------------------------------------------------

    def _chat(self, params: Params) -> JsonDict:
        """The chat named by chat_id (id or @username); 400 unknown, 403 blocked. Call holding the lock."""
        raw = params.raw.get("chat_id")
        if raw is None or raw == "":
            raise bad_request("chat_id is empty")
        if isinstance(raw, str) and raw.startswith("@"):
            chat = self._data.chat_by_username(raw)
        else:
            chat_id = params.integer("chat_id")
            chat = self._data.chats.get(chat_id) if chat_id is not None else None
        if chat is None:
            raise bad_request("chat not found")
        if chat["id"] in self._data.blocked:
            raise ApiError(403, self._data.blocked[chat["id"]])
        return chat

    async def get_chat(self, params: Params) -> Any:
        with self._lock:
            chat = copy.deepcopy(self._chat(params))
        # ChatFullInfo: PTB requires these alongside the Chat fields
        chat.update(
            accent_color_id=0,
            max_reaction_count=11,
            accepted_gift_types={
                "unlimited_gifts": False,
                "limited_gifts": False,
                "unique_gifts": False,
                "premium_subscription": False,
                "gifts_from_channels": False,
            },
        )
        return chat

    def _member(self, chat_id: int, user_id: int) -> JsonDict:
        user = self._data.user(user_id)
        if self._data.owners.get(chat_id) == user_id:
            return {"status": "creator", "user": user, "is_anonymous": False}
        if user_id in self._data.admins.get(chat_id, []):
            return {
                "status": "administrator",
                "user": user,
                "can_be_edited": False,
                "is_anonymous": False,
                "can_manage_chat": True,
                "can_delete_messages": True,
                "can_manage_video_chats": True,
                "can_restrict_members": True,
                "can_promote_members": False,
                "can_change_info": True,
                "can_invite_users": True,
                "can_post_stories": False,
                "can_edit_stories": False,
                "can_delete_stories": False,
                "can_pin_messages": True,
            }
        return {"status": "member", "user": user}

    async def get_chat_member(self, params: Params) -> Any:
        with self._lock:
            chat = self._chat(params)
            user_id = params.integer("user_id")
            if user_id is None:
                raise bad_request("user not found")
            return self._member(chat["id"], user_id)

    async def get_chat_administrators(self, params: Params) -> Any:
        with self._lock:
            chat = self._chat(params)
            if chat["type"] == "private":
                raise bad_request("there are no administrators in the private chat")
            owner = self._data.owners.get(chat["id"])
            ids = ([owner] if owner is not None else []) + [
                a for a in self._data.admins.get(chat["id"], []) if a != owner
            ]
            return [self._member(chat["id"], user_id) for user_id in ids]

    # --- messages -------------------------------------------------------------------------------

    def _parse(self, params: Params) -> ParsedText:
        text = params.string("text")
        if not text:
            raise bad_request("message text is empty")
        parse_mode = params.string("parse_mode")
        try:
            parsed = parse_text(text, parse_mode, strict_html=self._strict_html)
        except EntityParseError as exc:
            raise bad_request(f"can't parse entities: {exc}") from None
        except ValueError:
            raise bad_request("unsupported parse_mode") from None
        if not parse_mode:
            entities = params.json("entities")
            parsed.entities = copy.deepcopy(entities) if isinstance(entities, list) else []
        if not parsed.text.strip():
            raise bad_request("message text is empty")
        if len(parsed.text) > MAX_MESSAGE_TEXT_CHARS:
            raise bad_request("message is too long")
        return parsed

    def _reply_target(self, chat_id: int, params: Params) -> JsonDict | None:
        reply = params.json("reply_parameters")
        if isinstance(reply, dict):
            message_id, allow_missing = reply.get("message_id"), bool(reply.get("allow_sending_without_reply"))
        else:
            message_id = params.integer("reply_to_message_id")
            allow_missing = params.flag("allow_sending_without_reply")
        if message_id is None:
            return None
        target = self._data.reply_snapshot(chat_id, int(message_id))
        if target is None and not allow_missing:
            raise bad_request("message to be replied not found")
        return target

    async def send_message(self, params: Params) -> Any:
        with self._lock:
            chat = self._chat(params)
            parsed = self._parse(params)
            reply_to = self._reply_target(chat["id"], params)
            message: JsonDict = {
                "message_id": self._data.next_message_id(chat["id"]),
                "from": self._data.user(self._data.bot_id),
                "chat": copy.deepcopy(chat),
                "date": self._data.now(),
                "text": parsed.text,
            }
            if parsed.entities:
                message["entities"] = parsed.entities
            if reply_to is not None:
                message["reply_to_message"] = reply_to
            markup = params.json("reply_markup")
            if isinstance(markup, dict) and "inline_keyboard" in markup:
                message["reply_markup"] = markup  # Telegram echoes inline keyboards only
            self._data.store(message)
            self._data.sent.append(
                SentMessage(
                    chat_id=chat["id"],
                    message_id=message["message_id"],
                    text=params.string("text") or "",
                    parse_mode=params.string("parse_mode"),
                    plain_text=parsed.text,
                    entities=copy.deepcopy(parsed.entities),
                    reply_to_message_id=reply_to["message_id"] if reply_to else None,
                    reply_markup=markup,
                    message=copy.deepcopy(message),
                    at=time.monotonic(),
                )
            )
            self._watch.notify()
            return message

    async def send_chat_action(self, params: Params) -> Any:
        with self._lock:
            chat = self._chat(params)
            action = params.string("action")
            if action not in CHAT_ACTIONS:
                raise bad_request("wrong parameter action in request")
            self._data.actions.append(ChatAction(chat["id"], action, time.monotonic()))
            self._watch.notify()
        return True

    def _own_message(self, params: Params, missing: str) -> tuple[JsonDict, JsonDict]:
        if params.raw.get("inline_message_id"):
            raise bad_request("MESSAGE_ID_INVALID")
        chat = self._chat(params)
        message_id = params.integer("message_id")
        if message_id is None:
            raise bad_request("message identifier is not specified")
        message = self._data.stored(chat["id"], message_id)
        if message is None:
            raise bad_request(missing)
        return chat, message

    async def edit_message_text(self, params: Params) -> Any:
        with self._lock:
            _, message = self._own_message(params, "message to edit not found")
            if message["from"]["id"] != self._data.bot_id:
                raise bad_request("message can't be edited")
            parsed = self._parse(params)
            markup = params.json("reply_markup")
            if (
                parsed.text == message.get("text")
                and parsed.entities == message.get("entities", [])
                and markup == message.get("reply_markup")
            ):
                raise bad_request(NOT_MODIFIED_DESCRIPTION)
            message = copy.deepcopy(message)
            message.update(text=parsed.text, edit_date=self._data.now())
            message.pop("entities", None)
            if parsed.entities:
                message["entities"] = parsed.entities
            if isinstance(markup, dict) and "inline_keyboard" in markup:
                message["reply_markup"] = markup
            self._data.store(message)
            self._watch.notify()
            return message

    async def delete_message(self, params: Params) -> Any:
        with self._lock:
            chat, message = self._own_message(params, "message to delete not found")
            own = message["from"]["id"] == self._data.bot_id
            bot_is_admin = self._data.bot_id in self._data.admins.get(chat["id"], [])
            if not own and chat["type"] != "private" and not bot_is_admin:
                raise bad_request("message can't be deleted")
            del self._data.messages[(chat["id"], message["message_id"])]
            self._watch.notify()
        return True
