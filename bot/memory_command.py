"""/memory: the chat's notes with ids and who caused each; `/memory me` (a member's own notes), `/memory forget
<id>` (chat admins, or the member it came from), `/memory off|on` (chat admins); and /forgetme, which erases
everything the bot keeps about the member in this chat (notes, not the chat's history). A member's own notes are
theirs across the whole platform chat: in a forum, `/memory me`, `/forgetme` and `/memory forget <id>` reach
every topic's notes, not only the topic they are sent in.

Listings are sent unstored: a copy in the chat's history would outlive a /forgetme or /memory forget."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bot.agent.memory import Memory, note_line, parse_ref
from bot.channels.inbound import InboundMessage
from core.logging import get_logger
from core.store.chats import Chat

log = get_logger(__name__)

USAGE = "Usage: /memory, /memory me, /memory forget <id>, /memory off|on (admins); /forgetme erases your notes."
ADMINS_ONLY = "Only chat admins can turn this chat's notes off or on."
START_PRIVATE = (
    "I show your notes only in our private chat, never in the group: start one with me (open my profile, press "
    "Start), then send /memory me here again."
)
MAX_NOTE_ID_CHARS = 32
_MARKDOWN_SPECIALS = re.compile(r"[!-/:-@\[-`{-~]")  # ASCII punctuation: each may be backslash-escaped


def as_written(text: str) -> str:
    """Members' words in the bot's Markdown: shown as written, never as a link or a style (every ASCII
    punctuation mark escaped, as CommonMark allows): a note `[text](https://evil)` stays those characters."""
    return _MARKDOWN_SPECIALS.sub(r"\\\g<0>", text)


@dataclass(frozen=True, slots=True)
class Reply:
    text: str
    stored: bool = True  # False: sent once, kept nowhere (the notes themselves)
    private_to: int | None = None  # send to this conversation instead (a member's private chat with the bot)


class MemoryCommand:
    def __init__(
        self,
        memory: Memory,
        chat: Callable[[int], Awaitable[Chat | None]],
        conversations: Callable[[int], Awaitable[list[int]]] | None = None,
    ) -> None:
        self._memory = memory
        self._chat = chat  # a stored chat by id: a user's private chat with the bot has the user's id
        self._conversations = conversations  # a platform chat's conversations: itself and its forum topics

    async def _whole_chat(self, message: InboundMessage) -> list[int]:
        """The conversations of the platform chat the message was sent in (its topics), this one first."""
        found = await self._conversations(message.platform_id) if self._conversations is not None else []
        return [message.chat_id, *(c for c in found if c != message.chat_id)]

    async def reply(self, message: InboundMessage, is_admin: Callable[[], Awaitable[bool]]) -> Reply:
        chat_id, args = message.chat_id, [a.strip() for a in message.command_args]
        notes = self._memory.notes
        if message.command == "forgetme":
            return await self._forget_me(message)
        if not args:
            return await self._list(chat_id)
        verb = args[0].lower()
        if verb == "me" and len(args) == 1:
            return await self._mine(message)
        if verb == "forget" and len(args) == 2:
            return Reply(await self._forget(message, args[1], is_admin))
        if verb in ("off", "on") and len(args) == 1:
            if not await is_admin():
                log.info("command_refused", command="memory", user_id=message.sender_id)
                return Reply(ADMINS_ONLY)
            changed = await notes.set_off(chat_id, verb == "off", message.sender_name[:64])
            log.info("memory_switched", chat_id=chat_id, off=verb == "off", changed=changed)
            if verb == "off":
                return Reply(
                    "Notes are off in this chat: none are shown or kept. The ones kept stay hidden, and are "
                    "deleted after DATA_RETENTION_DAYS unless /memory on comes first."
                    if changed
                    else "Notes were already off in this chat."
                )
            return Reply("Notes are on in this chat." if changed else "Notes were already on in this chat.")
        return Reply(USAGE)

    async def _list(self, chat_id: int) -> Reply:
        limits = self._memory.limits
        chat_notes = await self._memory.notes.chat_notes(chat_id, limits.max_notes)
        off = " (off: none are shown or kept; /memory on, admins)" if await self._memory.notes.is_off(chat_id) else ""
        if not chat_notes:
            return Reply(f"This chat keeps no notes{off}. Ask me to remember something.")
        lines = [as_written(note_line(note)) for note in chat_notes]
        head = f"This chat's notes, newest first ({len(chat_notes)} of at most {limits.max_notes}){off}:"
        foot = "/memory forget <id> erases one (chat admins, or whoever asked for it)."
        return Reply("\n".join([head, *lines, foot]), stored=False)

    async def _mine(self, message: InboundMessage) -> Reply:
        if message.sender_id is None:
            return Reply("I cannot tell who you are here, so I keep no notes about you.")
        mine = [
            note
            for conversation in await self._whole_chat(message)
            for note in await self._memory.notes.member_notes(
                conversation, [message.sender_id], self._memory.limits.max_member_notes
            )
        ]
        if not mine:
            return Reply("I keep no notes about you in this chat.")
        lines = [as_written(note_line(note, with_causer=False)) for note in mine]
        text = "\n".join(
            ["What I keep about you in this chat:", *lines, "/memory forget <id> erases one; /forgetme erases all."]
        )
        if message.chat_kind in ("private", "console"):
            return Reply(text, stored=False)
        private = await self._chat(message.sender_id)
        if private is not None and private.kind == "private":
            return Reply(text, stored=False, private_to=private.id)
        return Reply(START_PRIVATE)  # what the bot keeps about a member is not the group's to read

    async def _forget(self, message: InboundMessage, ref: str, is_admin: Callable[[], Awaitable[bool]]) -> str:
        note_id, note = parse_ref(ref), None
        if note_id is not None:  # in any topic of the chat: a member's /memory me lists them all
            for conversation in await self._whole_chat(message):
                note = await self._memory.notes.get(conversation, note_id)
                if note is not None:
                    break
        if note is None:
            return f"No note {ref[:MAX_NOTE_ID_CHARS]} in this chat. /memory lists them."
        # Its owners first: no admin lookup (a Telegram call) for a member erasing their own.
        mine = message.sender_id is not None and message.sender_id in (note.caused_by_id, note.about_user_id)
        if not mine and not await is_admin():
            log.info("command_refused", command="memory forget", user_id=message.sender_id)
            return f"Only a chat admin or {as_written(note.caused_by_name)} can erase note {note.ref}."
        await self._memory.notes.delete(note.chat_id, note.id)
        log.info("note_erased", chat_id=note.chat_id, note_id=note.id)
        return f"Erased note {note.ref}."

    async def _forget_me(self, message: InboundMessage) -> Reply:
        if message.sender_id is None:
            return Reply("I cannot tell who you are here, so I keep no notes about you.")
        erased = await self._memory.notes.forget_member(await self._whole_chat(message), message.sender_id)
        log.info("member_forgotten", chat_id=message.chat_id, notes=erased)
        if not erased:
            return Reply("I keep no notes about you in this chat: nothing to erase.")
        return Reply(
            f"Erased {erased} note(s): every note about you and every note you asked for in this chat. "
            "The chat's history (its messages) stays: it is the chat's."
        )
