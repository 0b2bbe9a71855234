"""What the fake Telegram remembers: chats, users, messages, the update queue and what the bot did.

Plain data with no locking of its own: FakeTelegram and BotApi hold their shared lock around every use.
"""

from __future__ import annotations

import copy
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.fakes.telegram_files import FileStore
from tests.fakes.telegram_keyboards import CallbackBook
from tests.fakes.telegram_webhook_state import WebhookState

JsonDict = dict[str, Any]
ChatType = Literal["private", "group", "supergroup"]

# Telegram's id conventions: users and private chats are positive, supergroups are -100xxxxxxxxxx.
SUPERGROUP_ID_CEILING = -1_000_000_000_000
MAX_UPDATES_PER_POLL = 100


def chat_type_for(chat_id: int) -> ChatType:
    if chat_id > 0:
        return "private"
    return "supergroup" if chat_id <= SUPERGROUP_ID_CEILING else "group"


@dataclass(frozen=True)
class SentMessage:
    """One successful sendMessage."""

    chat_id: int
    message_id: int
    text: str  # as the bot sent it
    parse_mode: str | None
    plain_text: str  # as users see it, after parse_mode
    entities: list[JsonDict]
    reply_to_message_id: int | None
    reply_markup: Any
    message: JsonDict  # the Message object returned to the bot
    at: float  # time.monotonic()
    thread_id: int | None = None  # the forum topic it went to


@dataclass(frozen=True)
class Edit:
    """One successful editMessageText (a growing answer's step): the text as users see it, and when."""

    chat_id: int
    message_id: int
    plain_text: str
    parse_mode: str | None
    at: float  # time.monotonic()


@dataclass(frozen=True)
class Draft:
    """One successful sendMessageDraft (private chats): the draft's text as users see it, and when."""

    chat_id: int
    draft_id: int
    plain_text: str
    at: float  # time.monotonic()


@dataclass(frozen=True)
class ChatAction:
    chat_id: int
    action: str
    at: float  # time.monotonic()
    thread_id: int | None = None


@dataclass(frozen=True)
class ApiCall:
    """Any request with the right token, including failed and fault-injected ones."""

    method: str  # canonical spelling when known ("sendMessage"), else as requested
    params: JsonDict  # as received: form values are strings, JSON bodies keep their types
    at: float  # time.monotonic()


@dataclass
class TelegramData:
    bot_user: JsonDict
    chats: dict[int, JsonDict] = field(default_factory=dict)
    users: dict[int, JsonDict] = field(default_factory=dict)
    messages: dict[tuple[int, int], JsonDict] = field(default_factory=dict)
    last_message_id: dict[int, int] = field(default_factory=dict)
    updates: deque[JsonDict] = field(default_factory=deque)  # delivered but unconfirmed, and new
    next_update_id: int = 1
    poll_generation: int = 0  # a newer getUpdates ends older ones with 409 Conflict
    admins: dict[int, list[int]] = field(default_factory=dict)
    owners: dict[int, int] = field(default_factory=dict)
    blocked: dict[int, str] = field(default_factory=dict)  # chat id -> 403 description
    migrated: dict[int, int] = field(default_factory=dict)  # a group upgraded: old id -> supergroup id
    commands: dict[tuple[str, str], list[JsonDict]] = field(default_factory=dict)  # (scope, lang)
    sent: list[SentMessage] = field(default_factory=list)  # sendMessage only; files are in files.sent
    files: FileStore = field(default_factory=FileStore)
    actions: list[ChatAction] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)
    drafts: list[Draft] = field(default_factory=list)
    callbacks: CallbackBook = field(default_factory=CallbackBook)  # buttons pressed, and the bot's answers
    webhook: WebhookState = field(default_factory=WebhookState)  # as setWebhook left it ("" url: none)
    calls: list[ApiCall] = field(default_factory=list)
    call_counts: Counter[str] = field(default_factory=Counter)

    @property
    def bot_id(self) -> int:
        return int(self.bot_user["id"])

    # --- chats and users ------------------------------------------------------------------------

    def add_chat(self, chat_id: int, chat_type: ChatType | None = None, title: str | None = None) -> JsonDict:
        """The chat, created on first sight; a conflicting type is a mistake in the test."""
        kind = chat_type or chat_type_for(chat_id)
        chat = self.chats.get(chat_id)
        if chat is not None:
            if chat_type is not None and chat["type"] != chat_type:
                raise ValueError(f"chat {chat_id} is a {chat['type']}, not a {chat_type}")
            return chat
        if kind == "private":
            user = self.users.get(chat_id, {"first_name": f"User {chat_id}"})
            chat = {"id": chat_id, "type": "private", "first_name": user["first_name"]}
            if user.get("username"):
                chat["username"] = user["username"]
        else:
            chat = {"id": chat_id, "type": kind, "title": title or f"Test chat {chat_id}"}
        self.chats[chat_id] = chat
        return chat

    def chat_by_username(self, username: str) -> JsonDict | None:
        wanted = username.removeprefix("@").lower()
        return next((c for c in self.chats.values() if str(c.get("username", "")).lower() == wanted), None)

    def user(self, user_id: int) -> JsonDict:
        if user_id == self.bot_id:
            return {k: self.bot_user[k] for k in ("id", "is_bot", "first_name", "username")}
        return copy.deepcopy(self.users.get(user_id, {"id": user_id, "is_bot": False, "first_name": f"User {user_id}"}))

    # --- messages -------------------------------------------------------------------------------

    def next_message_id(self, chat_id: int) -> int:
        """Message ids count up per chat, shared by the users' and the bot's messages."""
        self.last_message_id[chat_id] = self.last_message_id.get(chat_id, 0) + 1
        return self.last_message_id[chat_id]

    def store(self, message: JsonDict) -> None:
        self.messages[(message["chat"]["id"], message["message_id"])] = copy.deepcopy(message)

    def stored(self, chat_id: int, message_id: int) -> JsonDict | None:
        return self.messages.get((chat_id, message_id))

    def reply_snapshot(self, chat_id: int, message_id: int) -> JsonDict | None:
        """A stored message as it appears in `reply_to_message` (Telegram does not nest further)."""
        message = self.stored(chat_id, message_id)
        if message is None:
            return None
        snapshot = copy.deepcopy(message)
        snapshot.pop("reply_to_message", None)
        return snapshot

    # --- updates --------------------------------------------------------------------------------

    def enqueue_update(self, update: JsonDict) -> JsonDict:
        update = copy.deepcopy(update)
        if "update_id" not in update:
            update["update_id"] = self.next_update_id
        self.next_update_id = max(self.next_update_id, int(update["update_id"])) + 1
        self.updates.append(update)
        return copy.deepcopy(update)

    def confirm(self, offset: int | None) -> None:
        """getUpdates' offset: drop updates below it; a negative one keeps only the last -offset."""
        if offset is None:
            return
        if offset < 0:
            while len(self.updates) > -offset:
                self.updates.popleft()
            return
        while self.updates and int(self.updates[0]["update_id"]) < offset:
            self.updates.popleft()

    def pending(self, limit: int) -> list[JsonDict]:
        return [copy.deepcopy(u) for u in list(self.updates)[:limit]]

    @staticmethod
    def now() -> int:
        return int(time.time())
