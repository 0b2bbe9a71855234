"""The `Channel` protocol: send text, send typing, check admins, deliver inbound messages to a handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from bot.inbound import InboundMessage
from core.outbox import DeliveryError

__all__ = ["Channel", "DeliveryError", "InboundHandler", "MembershipHandler"]

InboundHandler = Callable[[InboundMessage], Awaitable[None]]
# The bot was removed from a chat (False) or is in it again (True): chat id, present, the platform's words.
MembershipHandler = Callable[[int, bool, str], Awaitable[None]]


class Channel(Protocol):
    name: str

    async def start(self, handler: InboundHandler, on_membership: MembershipHandler | None = None) -> None:
        """Begin receiving; each message is passed to `handler`, in order within a chat; changes of the
        bot's own membership in a chat (removed, added back) to `on_membership`."""

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
