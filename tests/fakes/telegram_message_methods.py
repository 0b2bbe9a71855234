"""The fake Bot API's message methods: sendMessage, sendChatAction, editMessageText, deleteMessage, with
Telegram's validation and error descriptions."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

from tests.fakes.telegram_chat_methods import find_chat
from tests.fakes.telegram_keyboards import KeyboardError, check_inline_keyboard
from tests.fakes.telegram_params import Handler, Params, bad_request
from tests.fakes.telegram_parsed import MAX_MESSAGE_TEXT_CHARS, EntityParseError, ParsedText
from tests.fakes.telegram_state import ChatAction, Draft, Edit, JsonDict, SentMessage, TelegramData
from tests.fakes.telegram_text import parse_text
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
NOT_MODIFIED_DESCRIPTION = (
    "message is not modified: specified new message content and reply markup of the "
    "message are exactly the same as a current content and reply markup of the message"
)


def reply_target(data: TelegramData, chat_id: int, params: Params) -> JsonDict | None:
    """The message a send replies to (reply_parameters or the older reply_to_message_id), as a snapshot."""
    reply = params.json("reply_parameters")
    if isinstance(reply, dict):
        message_id, allow_missing = reply.get("message_id"), bool(reply.get("allow_sending_without_reply"))
    else:
        message_id = params.integer("reply_to_message_id")
        allow_missing = params.flag("allow_sending_without_reply")
    if message_id is None:
        return None
    target = data.reply_snapshot(chat_id, int(message_id))
    if target is None and not allow_missing:
        raise bad_request("message to be replied not found")
    return target


def inline_keyboard(params: Params) -> JsonDict | None:
    """The inline keyboard `reply_markup` gives a message, as Telegram checks it (400 when it refuses one)."""
    try:
        return check_inline_keyboard(params.json("reply_markup"))
    except KeyboardError as exc:
        raise bad_request(str(exc)) from None


def topic_thread(chat: JsonDict, params: Params) -> int | None:
    """A forum topic's id as sent; elsewhere Telegram ignores it (it names reply threads there)."""
    thread = params.integer("message_thread_id")
    return thread if chat.get("is_forum") else None


class MessageMethods:
    """The message methods over TelegramData; every read or write holds `lock`."""

    def __init__(self, data: TelegramData, lock: threading.RLock, watch: Watch, *, strict_html: bool) -> None:
        self._data = data
        self._lock = lock
        self._watch = watch
        self._strict_html = strict_html

    def handlers(self) -> dict[str, Handler]:
        return {
            "sendMessage": self.send_message,
            "sendChatAction": self.send_chat_action,
            "editMessageText": self.edit_message_text,
            "sendMessageDraft": self.send_message_draft,
            "deleteMessage": self.delete_message,
        }

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

    async def send_message(self, params: Params) -> Any:
        with self._lock:
            chat = find_chat(self._data, params)
            parsed = self._parse(params)
            reply_to = reply_target(self._data, chat["id"], params)
            thread = topic_thread(chat, params)
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
            if thread is not None:
                message.update(message_thread_id=thread, is_topic_message=True)
            markup = params.json("reply_markup")
            keyboard = inline_keyboard(params)
            if keyboard is not None:
                message["reply_markup"] = keyboard  # Telegram echoes inline keyboards only
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
                    thread_id=thread,
                )
            )
            self._watch.notify()
            return message

    async def send_chat_action(self, params: Params) -> Any:
        with self._lock:
            chat = find_chat(self._data, params)
            action = params.string("action")
            if action not in CHAT_ACTIONS:
                raise bad_request("wrong parameter action in request")
            thread = topic_thread(chat, params)
            self._data.actions.append(ChatAction(chat["id"], action, time.monotonic(), thread))
            self._watch.notify()
        return True

    def _own_message(self, params: Params, missing: str) -> tuple[JsonDict, JsonDict]:
        if params.raw.get("inline_message_id"):
            raise bad_request("MESSAGE_ID_INVALID")
        chat = find_chat(self._data, params)
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
            markup = inline_keyboard(params)
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
            message.pop("reply_markup", None)  # an edit without a keyboard takes the buttons away
            if markup is not None:
                message["reply_markup"] = markup
            self._data.store(message)
            at = time.monotonic()
            self._data.edits.append(
                Edit(message["chat"]["id"], message["message_id"], parsed.text, params.string("parse_mode"), at)
            )
            self._watch.notify()
            return message

    async def send_message_draft(self, params: Params) -> Any:
        """Bot API 9.3: a private chat's draft, shown while an answer is written (an empty text: "Thinking")."""
        with self._lock:
            chat = find_chat(self._data, params)
            if chat["type"] != "private":
                raise bad_request("TEXTDRAFT_PEER_INVALID")
            draft_id = params.integer("draft_id")
            if not draft_id:
                raise bad_request("draft_id must be non-zero")
            text = params.string("text") or ""
            plain = self._parse(params).text if text else ""
            self._data.drafts.append(Draft(chat["id"], draft_id, plain, time.monotonic()))
            self._watch.notify()
        return True

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
