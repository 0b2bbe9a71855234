"""The `Channel` protocol: send text, send typing, check admins, deliver inbound messages to a handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

from bot.channels.buttons import CardButton
from bot.channels.inbound import InboundMessage
from core.outbox import DeliveryError
from core.store.chats import ChatAddress
from core.store.outbox import OutgoingFile

__all__ = [
    "CardChannel",
    "CardGone",
    "Channel",
    "ChatAddress",
    "ChatDirectory",
    "DeliveryError",
    "InboundHandler",
    "MembershipHandler",
    "WatchedChannel",
]

InboundHandler = Callable[[InboundMessage], Awaitable[None]]
# The bot was removed from a chat (False) or is in it again (True): chat id, present, the platform's words.
MembershipHandler = Callable[[int, bool, str], Awaitable[None]]


class ChatDirectory(Protocol):
    """Conversations (chats and forum topics) by platform address, and back: core's ChatStore."""

    async def resolve(self, platform_chat_id: int, thread_id: int | None, kind: str, title: str | None) -> int: ...

    async def address(self, chat_id: int) -> ChatAddress: ...

    async def conversations_of(self, platform_chat_id: int) -> list[int]: ...

    async def migrate(self, old_platform_id: int, new_platform_id: int) -> list[int]: ...


class Channel(Protocol):
    name: str

    async def start(
        self,
        handler: InboundHandler,
        on_membership: MembershipHandler | None = None,
        directory: ChatDirectory | None = None,
    ) -> None:
        """Begin receiving; each message is passed to `handler`, in order within a chat; changes of the
        bot's own membership in a chat (removed, added back) to `on_membership`. With a `directory`, chat
        ids inside are conversations (a forum topic is one of its own), mapped to platform addresses."""

    async def stop_receiving(self) -> None:
        """Take no more inbound messages; sending still works (shutdown finishes its deliveries)."""

    async def stop(self) -> None: ...

    def split(self, text: str) -> list[str]:
        """The parts `text` is sent as (Telegram: at most 4,096 characters each, code blocks intact)."""

    async def send_part(self, chat_id: int, part: str, reply_to: int | None = None) -> int | None:
        """Send one part, formatted as the channel needs (a reply to platform message `reply_to`, or plain
        when that message is gone); its platform message id if it has one."""

    async def send_text(self, chat_id: int, text: str) -> list[int]:
        """Send every part of `text` now (for replies outside the outbox, e.g. to a chat not allowed)."""

    async def send_file(
        self, chat_id: int, file: OutgoingFile, caption: str, reply_to: int | None = None
    ) -> int | None:
        """One file a run sent (kept host-side), as a photo or a document, with its caption."""

    async def download_file(self, file_id: str, max_bytes: int) -> bytes:
        """A posted file's bytes, by the id the channel gave it; FileUnavailable says why not."""

    async def send_typing(self, chat_id: int) -> None: ...

    async def is_chat_admin(self, chat_id: int, user_id: int) -> bool: ...


class CardGone(Exception):
    """The message to edit is not there any more (deleted by someone): post a new one instead."""


@runtime_checkable
class CardChannel(Protocol):
    """A channel that can keep one message up to date (the subagents' status card)."""

    async def post_card(
        self, chat_id: int, text: str, reply_to: int | None, buttons: Sequence[CardButton] = ()
    ) -> int | None:
        """Post plain text with its buttons, as a reply to `reply_to` when given; its platform message id if
        it has one."""

    async def edit_card(self, chat_id: int, message_id: int, text: str, buttons: Sequence[CardButton] = ()) -> None:
        """Replace its text and buttons (none: the card has none left); "not modified" is success. Raises
        CardGone, or DeliveryError (429: retry_after)."""


@runtime_checkable
class WatchedChannel(Protocol):
    """A channel that receives in the background (Telegram's long polling), which can end by itself: a
    revoked token, or a bug. The bot then takes no message although it runs: not ready, and it must exit."""

    def receiving_failure(self) -> BaseException | None:
        """What ended receiving by itself; None while it runs, and after stop_receiving."""

    async def wait_receiving_failure(self) -> BaseException:
        """Until receiving ends by itself, then what ended it; a stop is no end by itself (a waiter then waits
        on, to be cancelled). Raises RuntimeError when the channel is not receiving."""
