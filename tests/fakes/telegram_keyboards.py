"""Inline keyboards and callback queries as the fake Telegram keeps them: Telegram's checks of an inline
keyboard the bot sends, the callback queries users made (a button pressed) and the bot's answers to them.

Plain data with no locking of its own: the fake holds its lock around every use.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.telegram_parsed import JsonDict

MAX_CALLBACK_DATA_BYTES = 64  # callback_data: 1-64 bytes
MAX_ANSWER_TEXT_CHARS = 200  # answerCallbackQuery's text: 0-200 characters
QUERY_INVALID = "query is too old and response timeout expired or query ID is invalid"
_BUTTON_KINDS = (
    "callback_data",
    "url",
    "web_app",
    "login_url",
    "switch_inline_query",
    "switch_inline_query_current_chat",
    "switch_inline_query_chosen_chat",
    "copy_text",
    "callback_game",
    "pay",
)


class KeyboardError(ValueError):
    """What Telegram says of an inline keyboard it refuses (a 400's reason)."""


def check_inline_keyboard(markup: Any) -> JsonDict | None:
    """The inline keyboard a message gets from `reply_markup`, as Telegram checks it; None for none (other
    markups, a reply keyboard say, are no inline keyboard and never echoed)."""
    if not isinstance(markup, dict) or "inline_keyboard" not in markup:
        return None
    rows = markup["inline_keyboard"]
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise KeyboardError("can't parse inline keyboard button: InlineKeyboardMarkup must be an Array of Arrays")
    for row in rows:
        for button in row:
            if not isinstance(button, dict) or not isinstance(button.get("text"), str):
                raise KeyboardError(
                    "can't parse inline keyboard button: Text buttons are unallowed in the inline keyboard"
                )
            if not button["text"].strip():
                raise KeyboardError("BUTTON_TEXT_INVALID")
            kinds = [kind for kind in _BUTTON_KINDS if kind in button]
            if len(kinds) != 1:
                raise KeyboardError(
                    "can't parse inline keyboard button: exactly one of the optional fields must be used"
                )
            data = button.get("callback_data")
            if "callback_data" in button and (
                not isinstance(data, str)
                or not 1 <= len(data.encode("utf-8", "surrogatepass")) <= MAX_CALLBACK_DATA_BYTES
            ):
                raise KeyboardError("BUTTON_DATA_INVALID")
    return markup if any(rows) else None  # an empty keyboard is none: the message shows no buttons


def _fits(data: object) -> bool:
    return isinstance(data, str) and 1 <= len(data.encode("utf-8", "surrogatepass")) <= MAX_CALLBACK_DATA_BYTES


def buttons_of(message: JsonDict | None) -> list[JsonDict]:
    """Every button of a message's inline keyboard, row by row; [] for a message without one."""
    if message is None:
        return []
    markup = message.get("reply_markup")
    rows = markup.get("inline_keyboard", []) if isinstance(markup, dict) else []
    return [button for row in rows for button in row]


@dataclass(frozen=True)
class CallbackQuery:
    """A button pressed: where (chat, message) and by whom, with the data the button carried."""

    query_id: str
    chat_id: int
    message_id: int
    user_id: int
    data: str
    at: float  # time.monotonic()


@dataclass(frozen=True)
class CallbackAnswer:
    """One successful answerCallbackQuery."""

    query_id: str
    text: str | None
    show_alert: bool
    at: float  # time.monotonic()
    url: str | None = None
    cache_time: int | None = None


@dataclass
class CallbackBook:
    """The callback queries users made and the bot's answers; each query can be answered once."""

    queries: dict[str, CallbackQuery] = field(default_factory=dict)
    answers: list[CallbackAnswer] = field(default_factory=list)

    @staticmethod
    def new_id() -> str:
        return str(secrets.randbits(63))  # Telegram's are long decimal numbers, as strings

    def answered(self, query_id: str) -> bool:
        return any(a.query_id == query_id for a in self.answers)
