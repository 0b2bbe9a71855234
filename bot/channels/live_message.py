"""What a channel offers for an answer shown while it is written (issue 36), and the design of streaming.

Design:
- Streaming is presentation, not delivery. The main agent's run streams from the model (pydantic-ai's
  `agent.iter`, each model request's node streamed: bot/agent/streamed_turn.py); the text so far goes to a
  LiveReply (bot/agent/live_reply.py), which shows it: in a group one message sent when the first words are
  there and edited as text arrives; in a private chat a draft (`sendMessageDraft`). The final text is stored
  once through the existing path, core/delivery.py: its outbox row carries the platform ids of the messages
  that showed it (`edit_ids`), and the outbox writes each part into its message by an edit (a deleted one
  is sent anew), with the outbox's exactly-once, crash-safe promise. Drafts need no edit: the final
  message is a plain sendMessage.
- Edits are paced (bot/channels/edit_pacer.py): at most one per group every STREAM_EDIT_INTERVAL_SECONDS
  (3 s: a group's 20 messages a minute), one draft per private chat every STREAM_DRAFT_INTERVAL_SECONDS,
  and STREAM_EDITS_PER_SECOND for all chats together; with many chats streaming each one's interval
  stretches so the sum stays inside the global budget. A 429 pushes that chat's next edit back by its
  retry_after and doubles its interval for minutes. Edits to a group also take places in the group's bucket
  of sends (bot/channels/telegram_limits.py), so its answers, results and cards together stay within the
  limit. Between two edits only the newest text matters: nothing queues.
- Each edit renders the whole text so far with the same Markdown-to-HTML renderer and the same split as a
  final message (bot/channels/formatting.py): the renderer closes every tag it opens, so half a code fence
  or half a link is valid HTML at every edit; a part that fills up (4,096 units) is left as it is and the
  text continues in a next message.
- A merge aborts the turn as before (its task cancelled: the HTTP stream closes); the live message stays on
  screen and the next turn writes into it; parts the merged answer does not need are deleted by the outbox
  before its row counts as sent. A Stop (button or command) aborts the same way and leaves the
  text so far, marked as stopped and by whom, stored as the bot's message.
- A crash: the live message is recorded (core/store/live_messages.py: its parts' ids at once, its text now and
  then) until its final text is owed, and the outbox row that owes it ends the record in its transaction. A
  record left at start (bot/agent/live_restart.py) has its turn answered into the same message, or, where
  that cannot be or is not safe (the question gone, the chat not allowed, the record older than 5 minutes, or
  its turn started a run or scheduled a task, which answering again would repeat), its text finished as
  interrupted, without Stop.
  A stop of the bot (SIGTERM) leaves the record too: the next start answers into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from bot.channels.buttons import CardButton
from core.outbox import DeliveryError, MessageGone

__all__ = ["DeliveryError", "LiveChannel", "MessageGone"]


@runtime_checkable
class LiveChannel(Protocol):
    """A channel that can show a message growing (Telegram): send it, edit it, or show a draft."""

    def split(self, text: str) -> list[str]: ...

    async def drafts_for(self, chat_id: int) -> bool:
        """Whether the chat shows a growing answer as a draft (private chats) rather than by edits."""

    async def send_live(self, chat_id: int, part: str, reply_to: int | None, buttons: Sequence[CardButton] = ()) -> int:
        """Send one part (Markdown, rendered as the channel does) with its buttons; its platform id."""

    async def edit_live(self, chat_id: int, message_id: int, part: str, buttons: Sequence[CardButton] = ()) -> None:
        """Rewrite a part; "not modified" is success. Raises MessageGone, or DeliveryError (429: retry_after)."""

    async def edit_part(self, chat_id: int, message_id: int, part: str) -> None:
        """The final text of a part, without buttons (the outbox's PartEditor)."""

    async def delete_part(self, chat_id: int, message_id: int) -> None:
        """Delete a part the final text does not need (the outbox's PartEditor); gone already is success."""

    async def send_draft(self, chat_id: int, draft_id: int, part: str) -> None:
        """Show `part` as the chat's draft `draft_id` (changes of one draft are animated)."""
