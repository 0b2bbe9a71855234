"""The users' side of the fake Telegram: chats, and messages (text, media, edits, raw updates) arriving as
updates for the bot. A mixin of FakeTelegram, which owns the state it works on."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from tests.fakes.telegram_files import MEDIA_KINDS, MediaKind
from tests.fakes.telegram_state import ChatType, JsonDict, TelegramData, chat_type_for
from tests.fakes.telegram_text import auto_entities
from tests.fakes.waiting import Watch

DEFAULT_USER_ID = 1001
DEFAULT_USER_FIRST_NAME = "Alice"


class UserSide:
    """What users do, as updates; every read or write holds the fake's lock."""

    _lock: threading.RLock
    _data: TelegramData
    _watch: Watch

    def add_chat(self, chat_id: int, *, chat_type: ChatType | None = None, title: str | None = None) -> JsonDict:
        """Make a chat known (the bot is in it) without a message; the type follows the id by default."""
        with self._lock:
            return copy.deepcopy(self._data.add_chat(chat_id, chat_type, title))

    def push_message(
        self,
        chat_id: int,
        text: str,
        *,
        chat_type: ChatType | None = None,
        user_id: int | None = None,
        first_name: str | None = None,
        username: str | None = None,
        reply_to_message_id: int | None = None,
        entities: list[JsonDict] | None = None,
        chat_title: str | None = None,
        thread_id: int | None = None,
    ) -> JsonDict:
        """A user's text message as an update (in forum topic `thread_id`); returns the update.

        chat_type defaults to what the id implies (>0 private, -100… supergroup, else group); the user
        defaults to the private chat's user or Alice (1001). entities=None adds the `bot_command` and
        `mention` entities Telegram would; reply_to_message_id may name any stored message, the bot's too.
        """

        def content() -> JsonDict:
            found = auto_entities(text) if entities is None else copy.deepcopy(entities)
            return {"text": text, "entities": found} if found else {"text": text}

        return self._push_user_message(
            chat_id, content, chat_type, user_id, first_name, username, reply_to_message_id, chat_title, thread_id
        )

    def push_media_message(
        self,
        chat_id: int,
        kind: MediaKind,
        data: bytes,
        *,
        file_name: str | None = None,
        mime_type: str | None = None,
        caption: str | None = None,
        caption_entities: list[JsonDict] | None = None,
        details: JsonDict | None = None,
        chat_type: ChatType | None = None,
        user_id: int | None = None,
        first_name: str | None = None,
        username: str | None = None,
        reply_to_message_id: int | None = None,
        chat_title: str | None = None,
        thread_id: int | None = None,
    ) -> JsonDict:
        """A user's document, photo, audio, voice, video, animation, video note or sticker as an update.

        The fake keeps `data` under a new file_id for getFile and the download. A photo must be a PNG, JPEG
        or WebP and arrives as a PhotoSize list (smallest first; the largest keeps `data` up to 2,560 px); it
        and a voice take no file name. mime_type defaults to a guess from the file name. `details` go into
        the media object (duration, width, height, performer, title, ...). caption_entities=None adds the
        entities Telegram would, as push_message does; the rest as for push_message.
        """
        if kind not in MEDIA_KINDS:
            raise ValueError(f"media kind is one of {MEDIA_KINDS}, not {kind!r}")

        def content() -> JsonDict:
            fields = self._data.files.media(kind, data, file_name=file_name, mime_type=mime_type, details=details)
            if caption:
                fields["caption"] = caption
                found = auto_entities(caption) if caption_entities is None else copy.deepcopy(caption_entities)
                if found:
                    fields["caption_entities"] = found
            return fields

        return self._push_user_message(
            chat_id, content, chat_type, user_id, first_name, username, reply_to_message_id, chat_title, thread_id
        )

    def _push_user_message(
        self,
        chat_id: int,
        content: Callable[[], JsonDict],
        chat_type: ChatType | None,
        user_id: int | None,
        first_name: str | None,
        username: str | None,
        reply_to_message_id: int | None,
        chat_title: str | None,
        thread_id: int | None,
    ) -> JsonDict:
        with self._lock:
            kind = chat_type or (self._data.chats[chat_id]["type"] if chat_id in self._data.chats else None)
            kind = kind or chat_type_for(chat_id)
            if user_id is None:
                user_id = chat_id if kind == "private" else DEFAULT_USER_ID
            if kind == "private" and user_id != chat_id:
                raise ValueError(f"a private chat's id is its user's id: chat {chat_id}, user {user_id}")
            user = self._remember_user(user_id, first_name, username)
            chat = self._data.add_chat(chat_id, kind, chat_title)
            target = None
            if reply_to_message_id is not None:
                target = self._data.reply_snapshot(chat_id, reply_to_message_id)
                if target is None:
                    raise ValueError(f"no message {reply_to_message_id} in chat {chat_id} to reply to")
            message: JsonDict = {
                "message_id": self._data.next_message_id(chat_id),
                "from": user,
                "chat": copy.deepcopy(chat),
                "date": self._data.now(),
                **content(),
            }
            if target is not None:
                message["reply_to_message"] = target
            if thread_id is not None:
                message.update(message_thread_id=thread_id, is_topic_message=True)
            self._data.store(message)
            update = self._data.enqueue_update({"message": message})
            self._watch.notify()
            return update

    def update_chat(self, chat_id: int, **fields: Any) -> None:
        """Change a known chat as Telegram would show it (e.g. is_forum=True for a forum)."""
        with self._lock:
            self._data.chats[chat_id].update(fields)

    def redirect_upgraded(self, old_id: int, new_id: int) -> None:
        """Calls on the old group answer 400 with migrate_to_chat_id, as after a supergroup upgrade."""
        with self._lock:
            self._data.migrated[old_id] = new_id

    def push_edited_message(
        self, chat_id: int, message_id: int, text: str, *, entities: list[JsonDict] | None = None
    ) -> JsonDict:
        """A user edits their earlier message; returns the `edited_message` update."""
        with self._lock:
            stored = self._data.stored(chat_id, message_id)
            if stored is None:
                raise ValueError(f"no message {message_id} in chat {chat_id} to edit")
            message = copy.deepcopy(stored)
            message.update(text=text, edit_date=self._data.now())
            message.pop("entities", None)
            found = auto_entities(text) if entities is None else copy.deepcopy(entities)
            if found:
                message["entities"] = found
            self._data.store(message)
            update = self._data.enqueue_update({"edited_message": message})
            self._watch.notify()
            return update

    def push_raw_update(self, update: JsonDict) -> JsonDict:
        """Any update (service messages, stickers, ...); update_id is assigned when absent.

        A message in it is stored (so later messages can reply to it) and its chat becomes known.
        """
        with self._lock:
            for kind in ("message", "edited_message", "channel_post", "edited_channel_post"):
                message = update.get(kind)
                if isinstance(message, dict) and isinstance(message.get("chat"), dict):
                    chat = message["chat"]
                    self._data.chats.setdefault(int(chat["id"]), copy.deepcopy(chat))
                    if "message_id" in message:
                        self._data.store(message)
            stored = self._data.enqueue_update(update)
            self._watch.notify()
            return stored

    def delete_message(self, chat_id: int, message_id: int) -> None:
        """A member (an admin) deleted the message: editing it now answers 400 "message to edit not found"."""
        with self._lock:
            if self._data.messages.pop((chat_id, message_id), None) is None:
                raise ValueError(f"no message {message_id} in chat {chat_id}")
            self._watch.notify()

    def _remember_user(self, user_id: int, first_name: str | None, username: str | None) -> JsonDict:
        known = self._data.users.get(user_id, {})
        default_name = DEFAULT_USER_FIRST_NAME if user_id == DEFAULT_USER_ID else f"User {user_id}"
        user: JsonDict = {
            "id": user_id,
            "is_bot": False,
            "first_name": first_name or known.get("first_name") or default_name,
        }
        if username or known.get("username"):
            user["username"] = username or known["username"]
        self._data.users[user_id] = user
        return copy.deepcopy(user)
