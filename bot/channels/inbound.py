"""What every channel hands the core: one message, already classified (trigger, command, placeholder)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from core.store.chat_files import NewFile


@dataclass(frozen=True, slots=True)
class InboundMessage:
    chat_id: int  # the conversation: a whole chat, or one forum topic (see core.store.chats)
    chat_kind: str  # private, group, supergroup, channel, console
    chat_title: str | None
    sender_id: int | None
    sender_name: str
    text: str
    platform_message_id: int | None = None
    edit_of: int | None = None  # an edit: the platform id of the message it changes
    edited_at: float | None = None  # an edit: when it was made (with edit_of, what makes it unique)
    reply_to: int | None = None
    triggers: bool = False  # asks the bot for a turn (mention, reply to the bot, private chat)
    sent_as_chat: bool = False  # posted on behalf of the chat itself: only its admins can (anonymous admin)
    kind: str = "text"  # text, file (with `file`), placeholder (other media, service), edit
    command: str | None = None  # "stop" for "/stop@crew_bot now"; only set for commands meant for us
    command_args: tuple[str, ...] = ()
    timestamp: float = field(default_factory=time.time)
    platform_chat_id: int | None = None  # the platform's chat id when it is not `chat_id` (topics, upgrades)
    thread_id: int | None = None  # the forum topic it was written in
    file: NewFile | None = None  # a document, photo, ... it carries, kept by reference

    @property
    def platform_id(self) -> int:
        return self.chat_id if self.platform_chat_id is None else self.platform_chat_id
