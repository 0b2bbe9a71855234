"""Bot messages out: stored as the bot's own first (never triggering a turn), then sent to the chat."""

from __future__ import annotations

from bot.channels.base import Channel, DeliveryError
from bot.logging import get_logger
from bot.store.messages import MessageStore, NewMessage

log = get_logger(__name__)


class Delivery:
    def __init__(self, messages: MessageStore, channel: Channel, assistant_name: str) -> None:
        self._messages = messages
        self._channel = channel
        self._assistant_name = assistant_name

    def outgoing_text(self, content: str) -> str:
        """What the chat sees: the assistant's name as prefix, as operators configure it."""
        return f"{self._assistant_name}: {content}"

    async def post(self, chat_id: int, content: str, *, kind: str = "reply", sender_name: str | None = None) -> bool:
        """Store and send; True when the chat got it. A send failure is logged, the stored copy stays."""
        await self._messages.add(
            NewMessage(
                chat_id=chat_id,
                sender_name=sender_name or self._assistant_name,
                content=content,
                is_bot=True,
                kind=kind,
            )
        )
        return await self.send_stored(chat_id, content, kind=kind)

    async def send_stored(self, chat_id: int, content: str, *, kind: str) -> bool:
        """Send a message the caller already stored (in its own transaction, e.g. with a run's outcome)."""
        try:
            await self._channel.send_text(chat_id, self.outgoing_text(content))
        except DeliveryError as exc:
            log.error("delivery_failed", chat_id=chat_id, kind=kind, permanent=exc.permanent, error=str(exc))
            return False
        return True

    async def notice(self, chat_id: int, content: str) -> bool:
        """A short operational notice (rejections, refusals, errors); stored so the agent sees it too."""
        return await self.post(chat_id, content, kind="notice")
