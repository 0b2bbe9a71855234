"""Telegram's limits as the channel meets them: flood limits applied to messages only, and Telegram's errors
as the senders know them."""

from __future__ import annotations

import datetime as dtm
from collections.abc import Callable, Coroutine
from typing import Any

from telegram._utils.types import JSONDict
from telegram.error import BadRequest, Forbidden, RetryAfter, TelegramError
from telegram.ext import AIORateLimiter

from core.outbox import DeliveryError

# Edits count in a group's 20 a minute as sends do: a growing answer's edits, the outbox's final edit, status
# cards and results to one group share its bucket, so together they stay inside it (no 429 cycle).
_MESSAGE_ENDPOINT_PREFIXES = ("send", "copy", "forward", "editMessage")
# A 400 with one of these means no message can reach the chat, as a 403 does.
_UNREACHABLE_MARKERS = ("chat not found", "bot was kicked", "bot was blocked", "not a member", "user is deactivated")


class MessageRateLimiter(AIORateLimiter):
    """Telegram's flood limits (20 per minute in a group) are for messages and their edits; nothing else is
    throttled.

    Without this, a typing action every few seconds would use up a group's budget and delay replies,
    and an admin check (getChatMember) in a chat with a backlog would queue behind its messages.
    """

    async def process_request(
        self,
        callback: Callable[..., Coroutine[Any, Any, bool | JSONDict | list[JSONDict]]],
        args: Any,
        kwargs: dict[str, Any],
        endpoint: str,
        data: dict[str, Any],
        rate_limit_args: int | None,
    ) -> bool | JSONDict | list[JSONDict]:
        if not _sends_a_message(endpoint):
            return await callback(*args, **kwargs)
        return await super().process_request(callback, args, kwargs, endpoint, data, rate_limit_args)


def _sends_a_message(endpoint: str) -> bool:
    """sendMessage, copyMessage, forwardMessages, editMessageText, ...: what Telegram's flood limits count."""
    return endpoint.startswith(_MESSAGE_ENDPOINT_PREFIXES) and endpoint != "sendChatAction"


def delivery_error(exc: TelegramError) -> DeliveryError:
    """Telegram's error as the senders know it: a 429 carries its wait; a kick, a block or a chat that is
    gone means nothing can reach the chat (a 403, or a 400 that says so)."""
    if isinstance(exc, RetryAfter):
        retry = exc.retry_after
        seconds = retry.total_seconds() if isinstance(retry, dtm.timedelta) else float(retry)
        return DeliveryError(str(exc), permanent=False, retry_after_seconds=seconds)
    unreachable = isinstance(exc, Forbidden) or (
        isinstance(exc, BadRequest) and any(m in str(exc).lower() for m in _UNREACHABLE_MARKERS)
    )
    return DeliveryError(str(exc), permanent=unreachable, chat_unreachable=unreachable)
