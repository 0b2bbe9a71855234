"""The status card on Telegram: its message, its buttons (an inline keyboard whose callback_data names only
the action and the run: "c:<run id>", "a:<run id>"; a question's "q:<question id>:<option>"), and the callback
queries a press sends, each answered exactly once.

A press is read (its data, the chat and forum topic of the card it is under, who pressed), handed to the
press handler, which checks everything again and acts, and then answered: Telegram shows a spinner until it is.
Data the bot never made, a handler that fails or is not there yet (a card from before a restart) still get an
answer. A storage failure is the exception: the update is not acknowledged and the poller hands it over again,
so it is answered then.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from telegram import Bot, CallbackQuery, InlineKeyboardButton, InlineKeyboardMarkup, Message, ReplyParameters
from telegram.error import BadRequest, TelegramError

from bot.channels.base import CardGone, ChatAddress, ChatDirectory
from bot.channels.buttons import CardAction, CardAnswer, CardButton, CardPress, PressHandler
from bot.channels.polling import STORAGE_ERRORS
from bot.channels.telegram_limits import delivery_error
from bot.channels.telegram_routing import thread_of
from core.logging import get_logger

log = get_logger(__name__)

MAX_CALLBACK_DATA_BYTES = 64  # Telegram's limit on a button's callback_data
MAX_ANSWER_CHARS = 200  # answerCallbackQuery's text
_CODES = {CardAction.CANCEL: "c", CardAction.CANCEL_ALL: "a", CardAction.STOP: "s", CardAction.ANSWER: "q"}
MAX_OPTION_INDEX = 99  # a question has a few options; more digits are data the bot never made
_ACTIONS = {code: action for action, code in _CODES.items()}
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # run ids are spawn request ids (container.contract.ID_PATTERN)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # a name is user input: it may reach the store (a cancel's reason)
UNKNOWN_BUTTON = "This button does nothing (any more)."
NOT_READY = "Not now: the bot is starting. Try again in a moment."
FAILED = "That did not work. /subagents lists the runs; /cancel <run id> cancels one."


def callback_data(button: CardButton) -> str:
    option = "" if button.option is None else f":{button.option}"
    return f"{_CODES[button.action]}:{button.run_id}{option}"


def parse_data(data: str | None) -> tuple[CardAction, str, int | None] | None:
    """The action, run (or question) and option a button's data names; None for data the bot never made."""
    if not data or len(data.encode("utf-8", "surrogatepass")) > MAX_CALLBACK_DATA_BYTES:
        return None
    code, colon, rest = data.partition(":")
    action = _ACTIONS.get(code)
    run_id, option = rest, None
    if action is CardAction.ANSWER:
        run_id, colon, index = rest.partition(":")
        if not colon or not index.isascii() or not index.isdigit() or int(index) > MAX_OPTION_INDEX:
            return None
        option = int(index)
    if not colon or action is None or _RUN_ID.fullmatch(run_id) is None:
        return None
    return action, run_id, option


def keyboard(buttons: Sequence[CardButton]) -> InlineKeyboardMarkup | None:
    """One button per row (labels stay readable on a phone); None when the card has none."""
    rows = []
    for button in buttons:
        data = callback_data(button)
        if len(data.encode("utf-8")) > MAX_CALLBACK_DATA_BYTES:
            log.warning("card_button_left_out", run_id=button.run_id, reason="run id too long for callback_data")
            continue
        rows.append([InlineKeyboardButton(button.label, callback_data=data)])
    return InlineKeyboardMarkup(rows) if rows else None


async def send_card(
    bot: Bot, address: ChatAddress, text: str, reply_to: int | None, buttons: Sequence[CardButton]
) -> int:
    """Post the card, plain text, with its buttons; a reply to `reply_to` unless that message is gone."""
    reply = None if reply_to is None else ReplyParameters(reply_to, allow_sending_without_reply=True)
    try:
        sent = await bot.send_message(
            address.platform_chat_id,
            text,
            message_thread_id=address.thread_id,
            reply_parameters=reply,
            reply_markup=keyboard(buttons),
        )
    except TelegramError as exc:
        raise delivery_error(exc) from exc
    return int(sent.message_id)


async def edit_card(bot: Bot, address: ChatAddress, message_id: int, text: str, buttons: Sequence[CardButton]) -> None:
    """Its text and buttons now (an edit without a keyboard takes the buttons away); "not modified" is fine."""
    try:
        await bot.edit_message_text(
            text, chat_id=address.platform_chat_id, message_id=message_id, reply_markup=keyboard(buttons)
        )
    except BadRequest as exc:
        reason = str(exc).lower()
        if "not modified" in reason:
            return  # it already shows this text
        if "not found" in reason:
            raise CardGone(str(exc)) from exc
        raise delivery_error(exc) from exc
    except TelegramError as exc:
        raise delivery_error(exc) from exc


class Presses:
    """Callback queries, from reading to answering; `handler` is set once the bot takes presses."""

    def __init__(self) -> None:
        self.handler: PressHandler | None = None

    async def handle(self, bot: Bot, query: CallbackQuery, directory: ChatDirectory) -> None:
        try:
            answer = await self._decide(query, directory)
        except STORAGE_ERRORS:
            raise  # not acknowledged: the same press comes again, and is answered then
        except Exception:
            log.exception("card_press_failed", press_id=query.id)
            answer = CardAnswer(FAILED, alert=True)
        try:
            await bot.answer_callback_query(
                query.id, text=answer.text[:MAX_ANSWER_CHARS] or None, show_alert=answer.alert
            )
        except TelegramError as exc:  # too late (about 15 s), or answered before a restart
            log.warning("card_press_not_answered", press_id=query.id, error=str(exc))
        if answer.clear_buttons and query.message is not None:
            try:
                await bot.edit_message_reply_markup(query.message.chat.id, query.message.message_id)
            except TelegramError as exc:  # gone, or already without buttons
                log.info("card_buttons_not_cleared", press_id=query.id, error=str(exc))

    async def _decide(self, query: CallbackQuery, directory: ChatDirectory) -> CardAnswer:
        message = query.message
        named = parse_data(query.data)
        chat_id = message.chat.id if message is not None else None
        if named is None or message is None:
            log.info("card_press_unreadable", press_id=query.id, chat_id=chat_id, user_id=query.from_user.id)
            return CardAnswer(UNKNOWN_BUTTON)
        if self.handler is None:
            return CardAnswer(NOT_READY)
        chat = message.chat
        # A message older than 48 hours comes without its topic: it then names the whole chat.
        thread = thread_of(message) if isinstance(message, Message) else None
        conversation = await directory.resolve(chat.id, thread, str(chat.type), chat.title)
        user = query.from_user
        press = CardPress(
            chat_id=conversation,
            chat_kind=str(chat.type),
            user_id=user.id,
            user_name=_LONE_SURROGATE.sub("\ufffd", user.full_name or user.username or str(user.id)),
            action=named[0],
            run_id=named[1],
            option=named[2],
            press_id=query.id,
            message_id=message.message_id,
            platform_chat_id=None if conversation == chat.id else chat.id,
        )
        return await self.handler(press)
