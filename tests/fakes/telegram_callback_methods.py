"""Buttons on the fake Telegram: users press them (`push_callback_query`, a callback_query update), the bot
answers each press (answerCallbackQuery: once, within Telegram's rules) and changes a message's buttons alone
(editMessageReplyMarkup). CallbackSide is a mixin of FakeTelegram, which owns the state it works on."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

from tests.fakes.telegram_chat_methods import find_chat
from tests.fakes.telegram_keyboards import (
    MAX_ANSWER_TEXT_CHARS,
    QUERY_INVALID,
    CallbackAnswer,
    CallbackQuery,
    KeyboardError,
    buttons_of,
    check_inline_keyboard,
)
from tests.fakes.telegram_message_methods import NOT_MODIFIED_DESCRIPTION
from tests.fakes.telegram_params import Handler, Params, bad_request
from tests.fakes.telegram_state import JsonDict, TelegramData
from tests.fakes.waiting import Watch

DEFAULT_PRESSER_ID = 1001  # Alice, as for messages


class CallbackMethods:
    """answerCallbackQuery and editMessageReplyMarkup over TelegramData; every read or write holds `lock`."""

    def __init__(self, data: TelegramData, lock: threading.RLock, watch: Watch) -> None:
        self._data = data
        self._lock = lock
        self._watch = watch

    def handlers(self) -> dict[str, Handler]:
        return {"answerCallbackQuery": self.answer_callback_query, "editMessageReplyMarkup": self.edit_reply_markup}

    async def answer_callback_query(self, params: Params) -> Any:
        query_id = params.string("callback_query_id")
        if not query_id:
            raise bad_request('parameter "callback_query_id" is required')
        text = params.string("text")
        if text is not None and len(text) > MAX_ANSWER_TEXT_CHARS:
            raise bad_request("MESSAGE_TOO_LONG")
        with self._lock:
            book = self._data.callbacks
            if query_id not in book.queries or book.answered(query_id):
                raise bad_request(QUERY_INVALID)  # Telegram takes one answer per query
            book.answers.append(
                CallbackAnswer(
                    query_id=query_id,
                    text=text,
                    show_alert=params.flag("show_alert"),
                    at=time.monotonic(),
                    url=params.string("url"),
                    cache_time=params.integer("cache_time"),
                )
            )
            self._watch.notify()
        return True

    async def edit_reply_markup(self, params: Params) -> Any:
        with self._lock:
            if params.raw.get("inline_message_id"):
                raise bad_request("MESSAGE_ID_INVALID")
            chat = find_chat(self._data, params)
            message_id = params.integer("message_id")
            if message_id is None:
                raise bad_request("message identifier is not specified")
            message = self._data.stored(chat["id"], message_id)
            if message is None:
                raise bad_request("message to edit not found")
            if message["from"]["id"] != self._data.bot_id:
                raise bad_request("message can't be edited")
            try:
                markup = check_inline_keyboard(params.json("reply_markup"))
            except KeyboardError as exc:
                raise bad_request(str(exc)) from None
            if markup == message.get("reply_markup"):
                raise bad_request(NOT_MODIFIED_DESCRIPTION)
            message = copy.deepcopy(message)
            message["edit_date"] = self._data.now()
            message.pop("reply_markup", None)  # none given: the buttons go
            if markup is not None:
                message["reply_markup"] = markup
            self._data.store(message)
            self._watch.notify()
            return message


class CallbackSide:
    """Users pressing buttons, and what the bot answered; every read or write holds the fake's lock."""

    _lock: threading.RLock
    _data: TelegramData
    _watch: Watch

    def push_callback_query(
        self,
        chat_id: int,
        message_id: int,
        data: str | bytes,
        *,
        user_id: int = DEFAULT_PRESSER_ID,
        first_name: str | None = None,
        inaccessible: bool = False,
    ) -> str:
        """A user pressed a button of message `message_id` carrying `data` (any data: Telegram passes on what
        a client sends, so a test can forge it; bytes arrive as Telegram would decode them); the query's id.

        The update carries the message as it stands now; `inaccessible` (or a message the fake does not
        have) sends it as Telegram does for one older than 48 hours: its chat and id only, date 0."""
        with self._lock:
            if chat_id not in self._data.chats:
                raise ValueError(f"no chat {chat_id}: add_chat or push a message first")
            known = self._data.users.get(user_id, {})
            user: JsonDict = {
                "id": user_id,
                "is_bot": False,
                "first_name": first_name or known.get("first_name") or f"User {user_id}",
            }
            self._data.users[user_id] = user
            stored = self._data.stored(chat_id, message_id)
            chat = copy.deepcopy(self._data.chats[chat_id])
            message = (
                {"chat": chat, "message_id": message_id, "date": 0}
                if inaccessible or stored is None
                else copy.deepcopy(stored)
            )
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
            query = CallbackQuery(self._data.callbacks.new_id(), chat_id, message_id, user_id, text, time.monotonic())
            self._data.callbacks.queries[query.query_id] = query
            self._data.enqueue_update(
                {
                    "callback_query": {
                        "id": query.query_id,
                        "from": copy.deepcopy(user),
                        "message": message,
                        "chat_instance": str(abs(chat_id) * 7919),
                        "data": text,
                    }
                }
            )
            self._watch.notify()
            return query.query_id

    def callback_answers(self, query_id: str | None = None) -> list[CallbackAnswer]:
        """The bot's answerCallbackQuery calls that Telegram took, in order (one query's, or all)."""
        with self._lock:
            return [a for a in self._data.callbacks.answers if query_id is None or a.query_id == query_id]

    def unanswered_queries(self) -> list[CallbackQuery]:
        """Presses the bot has not answered (Telegram shows their spinner until it does)."""
        with self._lock:
            book = self._data.callbacks
            return [q for q in book.queries.values() if not book.answered(q.query_id)]

    def buttons(self, chat_id: int, message_id: int) -> list[JsonDict]:
        """The inline keyboard's buttons of a message as it stands now, row by row; [] when it has none."""
        with self._lock:
            return copy.deepcopy(buttons_of(self._data.stored(chat_id, message_id)))

    async def wait_for_answer(self, query_id: str, timeout_seconds: float = 5.0) -> CallbackAnswer:
        """The bot's answer to the press, once it came."""

        def answered() -> CallbackAnswer | None:
            found = self.callback_answers(query_id)
            return found[0] if found else None

        try:
            return await self._watch.wait_for(answered, timeout_seconds)
        except TimeoutError:
            raise TimeoutError(f"callback query {query_id} not answered within {timeout_seconds} s") from None
