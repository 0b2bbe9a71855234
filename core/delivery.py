"""Bot messages out: stored as the bot's own (never triggering a turn) and owed to the chat in one step."""

from __future__ import annotations

import dataclasses

from core.outbox import Outbox
from core.store.messages import NewMessage
from core.store.outbox import OutboxStore, Outgoing


class Delivery:
    def __init__(self, store: OutboxStore, outbox: Outbox, assistant_name: str) -> None:
        self._store = store
        self._outbox = outbox
        self._assistant_name = assistant_name

    def outgoing(
        self, chat_id: int, content: str, *, kind: str, sender_name: str | None = None, reply_to: int | None = None
    ) -> Outgoing:
        """The stored copy (what prompts see) and what the chat is sent: prefixed with the assistant's name,
        as a reply to platform message `reply_to` when given."""
        message = NewMessage(
            chat_id=chat_id, sender_name=sender_name or self._assistant_name, content=content, is_bot=True, kind=kind
        )
        return Outgoing(message=message, text=f"{self._assistant_name}: {content}", reply_to=reply_to)

    async def post(
        self,
        chat_id: int,
        content: str,
        *,
        kind: str = "reply",
        sender_name: str | None = None,
        wait: bool = True,
        reply_to: int | None = None,
    ) -> bool:
        """Store and send. With `wait` the first attempt happens now and True means the chat has it;
        either way a failed send is retried by the outbox, also after a restart."""
        await self._store.add(self.outgoing(chat_id, content, kind=kind, sender_name=sender_name, reply_to=reply_to))
        if wait:
            return await self._outbox.flush(chat_id)
        self._outbox.flush_soon(chat_id)
        return False

    async def post_answer(
        self,
        chat_id: int,
        content: str,
        *,
        kind: str = "reply",
        reply_to: int | None = None,
        edit_ids: tuple[int, ...] = (),
        finishes_live: str | None = None,
    ) -> int | None:
        """Store and send now, like `post`; the platform id of its first part if it went out now. With
        `edit_ids` (a streamed answer) its parts are written into those messages, the rest sent anew; with
        `finishes_live` the turn's live-message record ends in the same transaction."""
        outgoing = self.outgoing(chat_id, content, kind=kind, reply_to=reply_to)
        row_id = await self._store.add(dataclasses.replace(outgoing, edit_ids=edit_ids, finishes_live=finishes_live))
        self._outbox.track(row_id)
        await self._outbox.flush(chat_id)
        return self._outbox.take_platform_id(row_id)

    async def owe_answer(
        self,
        chat_id: int,
        content: str,
        *,
        kind: str,
        reply_to: int | None = None,
        edit_ids: tuple[int, ...] = (),
        finishes_live: str | None = None,
    ) -> None:
        """Store it and owe it to the chat, as `post_answer`, without sending: the outbox sends it when it runs
        (at start-up, before the channel is up)."""
        outgoing = self.outgoing(chat_id, content, kind=kind, reply_to=reply_to)
        await self._store.add(dataclasses.replace(outgoing, edit_ids=edit_ids, finishes_live=finishes_live))

    async def notice(self, chat_id: int, content: str, *, wait: bool = False, reply_to: int | None = None) -> bool:
        """A short operational notice (rejections, refusals, errors); stored so the agent sees it too.
        Sent in the background by default: notices answer updates, which must not wait on the chat."""
        return await self.post(chat_id, content, kind="notice", wait=wait, reply_to=reply_to)

    def reply_unstored(self, chat_id: int, text: str) -> None:
        """Answer a chat the bot does not work in (nothing stored, no retry), in the background."""
        self._outbox.send_unstored_soon(chat_id, text)

    async def drop_run_messages(self, run_id: str, reason: str) -> int:
        """A cancelled run's progress messages that were not sent yet are not sent."""
        return await self._store.drop_for_run(run_id, reason)

    def send_soon(self, chat_id: int) -> None:
        """Send what a caller staged in its own transaction, in the background (never waits on the chat)."""
        self._outbox.flush_soon(chat_id)

    async def flush(self, chat_id: int) -> bool:
        """Send what a caller staged in its own transaction (e.g. a run's outcome with its message)."""
        return await self._outbox.flush(chat_id)
