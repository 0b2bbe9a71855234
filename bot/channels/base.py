"""The `Channel` protocol: send text, send typing, check admins, deliver inbound messages to a handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from bot.inbound import InboundMessage
from core.outbox import DeliveryError

__all__ = ["CardChannel", "CardGone", "Channel", "DeliveryError", "InboundHandler"]

InboundHandler = Callable[[InboundMessage], Awaitable[None]]


class Channel(Protocol):
    name: str

    async def start(self, handler: InboundHandler) -> None:
        """Begin receiving; each message is passed to `handler`, in order within a chat."""

    async def stop_receiving(self) -> None:
        """Take no more inbound messages; sending still works (shutdown finishes its deliveries)."""

    async def stop(self) -> None: ...

    def split(self, text: str) -> list[str]:
        """The parts `text` is sent as (Telegram: at most 4,096 characters each, code blocks intact)."""

    async def send_part(self, chat_id: int, part: str) -> int | None:
        """Send one part, formatted as the channel needs; its platform message id if it has one."""

    async def send_text(self, chat_id: int, text: str) -> list[int]:
        """Send every part of `text` now (for replies outside the outbox, e.g. to a chat not allowed)."""

    async def send_typing(self, chat_id: int) -> None: ...

    async def is_chat_admin(self, chat_id: int, user_id: int) -> bool: ...


class CardGone(Exception):
    """The message to edit is not there any more (deleted by someone): post a new one instead."""


@runtime_checkable
class CardChannel(Protocol):
    """A channel that can keep one message up to date (the subagents' status card)."""

    async def post_card(self, chat_id: int, text: str, reply_to: int | None) -> int | None:
        """Post plain text, as a reply to `reply_to` when given; its platform message id if it has one."""

    async def edit_card(self, chat_id: int, message_id: int, text: str) -> None:
        """Replace its text; "not modified" is success. Raises CardGone, or DeliveryError (429: retry_after)."""
