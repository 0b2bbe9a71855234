"""The Telegram side of a growing answer (bot/channels/live_message.py): send it with its Stop button, edit it,
show a draft in a private chat, and write a final part into its message (the outbox's PartEditor)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from telegram import Bot, InlineKeyboardMarkup, ReplyParameters
from telegram.constants import ParseMode
from telegram.error import BadRequest, EndPointNotFound, TelegramError

from bot.channels.base import ChatAddress, ChatDirectory
from bot.channels.buttons import CardButton
from bot.channels.formatting import TELEGRAM_MESSAGE_LIMIT_UNITS, markdown_to_telegram_html, utf16_len, visible_text
from bot.channels.telegram_cards import keyboard
from bot.channels.telegram_limits import delivery_error
from core.logging import get_logger
from core.outbox import DeliveryError, MessageGone

log = get_logger(__name__)

_GONE_MARKERS = ("message to edit not found", "message can't be edited", "message_id_invalid")
_DELETED_MARKER = "message to delete not found"
# In TelegramStreaming._drafts_refused: the Bot API has no sendMessageDraft at all (a server older than 9.3).
DRAFTS_REFUSED_EVERYWHERE = 0


def _html_of(part: str) -> str | None:
    """The part as Telegram HTML, or None when its visible text would be over the limit (sent plain)."""
    rendered = markdown_to_telegram_html(part)
    return rendered if utf16_len(visible_text(rendered)) <= TELEGRAM_MESSAGE_LIMIT_UNITS else None


def _parse_refused(exc: BadRequest) -> bool:
    reason = str(exc).lower()
    return "parse" in reason or "entit" in reason


async def html_or_plain(part: str, call: Callable[[str, str | None], Awaitable[Any]]) -> Any:
    """`call(text, parse_mode)` with the HTML; again with the plain part when Telegram refuses the HTML."""
    rendered = _html_of(part)
    if rendered is not None:
        try:
            return await call(rendered, ParseMode.HTML)
        except BadRequest as exc:
            if not _parse_refused(exc):
                raise
            log.warning("html_rejected_sending_plain", error=str(exc))
    return await call(part, None)


class TelegramStreaming:
    """Mixed into TelegramChannel, which gives the bot and the directory of conversations."""

    _directory: ChatDirectory
    # Private chats (Telegram ids) whose drafts Telegram refused, remembered while the process runs: their
    # answers grow by edits as a group's do, and no further draft is tried (each would fail with a warning).
    _drafts_refused: set[int]

    def _telegram(self) -> Bot:
        raise NotImplementedError

    async def drafts_for(self, chat_id: int) -> bool:
        address = await self._directory.address(chat_id)
        # Telegram's users (private chats) have positive ids.
        return address.platform_chat_id > 0 and not self._refused_drafts(address.platform_chat_id)

    def _refused_drafts(self, platform_chat_id: int) -> bool:
        return not self._drafts_refused.isdisjoint((platform_chat_id, DRAFTS_REFUSED_EVERYWHERE))

    def _refuse_drafts(self, platform_chat_id: int, exc: TelegramError) -> DeliveryError:
        self._drafts_refused.add(platform_chat_id)
        log.warning("drafts_refused_editing_instead", platform_chat_id=platform_chat_id, error=str(exc))
        return DeliveryError(str(exc), permanent=True)

    async def send_live(self, chat_id: int, part: str, reply_to: int | None, buttons: Sequence[CardButton] = ()) -> int:
        address = await self._directory.address(chat_id)
        reply = None if reply_to is None else ReplyParameters(reply_to, allow_sending_without_reply=True)
        markup = keyboard(buttons)

        async def send(text: str, parse_mode: str | None) -> int:
            sent = await self._telegram().send_message(
                address.platform_chat_id,
                text,
                parse_mode=parse_mode,
                message_thread_id=address.thread_id,
                reply_parameters=reply,
                reply_markup=markup,
            )
            return int(sent.message_id)

        try:
            return int(await html_or_plain(part, send))
        except TelegramError as exc:
            raise delivery_error(exc) from exc

    async def edit_live(self, chat_id: int, message_id: int, part: str, buttons: Sequence[CardButton] = ()) -> None:
        await self._edit(await self._directory.address(chat_id), message_id, part, keyboard(buttons))

    async def edit_part(self, chat_id: int, message_id: int, part: str) -> None:
        await self._edit(await self._directory.address(chat_id), message_id, part, None)

    async def delete_part(self, chat_id: int, message_id: int) -> None:
        address = await self._directory.address(chat_id)
        try:
            await self._telegram().delete_message(address.platform_chat_id, message_id)
        except BadRequest as exc:
            if _DELETED_MARKER in str(exc).lower():
                return  # a member, or this delete before a crash, did it already
            known = delivery_error(exc)  # a refusal (too old to delete) does not pass by waiting
            raise DeliveryError(str(exc), permanent=True, chat_unreachable=known.chat_unreachable) from exc
        except TelegramError as exc:
            raise delivery_error(exc) from exc

    async def _edit(
        self, address: ChatAddress, message_id: int, part: str, markup: InlineKeyboardMarkup | None
    ) -> None:
        async def edit(text: str, parse_mode: str | None) -> None:
            await self._telegram().edit_message_text(
                text,
                chat_id=address.platform_chat_id,
                message_id=message_id,
                parse_mode=parse_mode,
                reply_markup=markup,
            )

        try:
            await html_or_plain(part, edit)
        except BadRequest as exc:
            reason = str(exc).lower()
            if "not modified" in reason:
                return  # it already shows this text
            if any(marker in reason for marker in _GONE_MARKERS):
                raise MessageGone(str(exc)) from exc
            raise delivery_error(exc) from exc
        except TelegramError as exc:
            raise delivery_error(exc) from exc

    async def send_draft(self, chat_id: int, draft_id: int, part: str) -> None:
        address = await self._directory.address(chat_id)

        async def draft(text: str, parse_mode: str | None) -> None:
            await self._telegram().send_message_draft(
                address.platform_chat_id, draft_id, text, message_thread_id=address.thread_id, parse_mode=parse_mode
            )

        if self._refused_drafts(address.platform_chat_id):
            raise DeliveryError("drafts were refused in this chat", permanent=True)
        try:
            await html_or_plain(part, draft)
        except EndPointNotFound as exc:
            raise self._refuse_drafts(DRAFTS_REFUSED_EVERYWHERE, exc) from exc
        except BadRequest as exc:
            known = delivery_error(exc)
            if known.chat_unreachable:
                raise known from exc
            # Not the text (html_or_plain sent it plain after a parse refusal): drafts themselves are refused.
            raise self._refuse_drafts(address.platform_chat_id, exc) from exc
        except TelegramError as exc:
            raise delivery_error(exc) from exc
