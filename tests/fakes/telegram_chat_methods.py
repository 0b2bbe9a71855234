"""The fake Bot API's chat methods (getChat, getChatMember, getChatAdministrators) and `find_chat`, the lookup
of the chat a request names."""

from __future__ import annotations

import copy
import threading
from typing import Any

from tests.fakes.telegram_params import ApiError, Handler, Params, bad_request
from tests.fakes.telegram_state import JsonDict, TelegramData


def find_chat(data: TelegramData, params: Params) -> JsonDict:
    """The chat named by chat_id (id or @username); 400 unknown, 403 blocked. Call holding the lock."""
    raw = params.raw.get("chat_id")
    if raw is None or raw == "":
        raise bad_request("chat_id is empty")
    if isinstance(raw, str) and raw.startswith("@"):
        chat = data.chat_by_username(raw)
    else:
        chat_id = params.integer("chat_id")
        chat = data.chats.get(chat_id) if chat_id is not None else None
    if chat is None:
        raise bad_request("chat not found")
    if chat["id"] in data.migrated:
        upgraded = {"migrate_to_chat_id": data.migrated[chat["id"]]}
        raise ApiError(400, "Bad Request: group chat was upgraded to a supergroup chat", upgraded)
    if chat["id"] in data.blocked:
        raise ApiError(403, data.blocked[chat["id"]])
    return chat


class ChatMethods:
    """The chat methods over TelegramData; every read holds `lock`."""

    def __init__(self, data: TelegramData, lock: threading.RLock) -> None:
        self._data = data
        self._lock = lock

    def handlers(self) -> dict[str, Handler]:
        return {
            "getChat": self.get_chat,
            "getChatMember": self.get_chat_member,
            "getChatAdministrators": self.get_chat_administrators,
        }

    async def get_chat(self, params: Params) -> Any:
        with self._lock:
            chat = copy.deepcopy(find_chat(self._data, params))
        # ChatFullInfo: PTB requires these alongside the Chat fields
        chat.update(
            accent_color_id=0,
            max_reaction_count=11,
            accepted_gift_types={
                "unlimited_gifts": False,
                "limited_gifts": False,
                "unique_gifts": False,
                "premium_subscription": False,
                "gifts_from_channels": False,
            },
        )
        return chat

    def _member(self, chat_id: int, user_id: int) -> JsonDict:
        user = self._data.user(user_id)
        if self._data.owners.get(chat_id) == user_id:
            return {"status": "creator", "user": user, "is_anonymous": False}
        if user_id in self._data.admins.get(chat_id, []):
            return {
                "status": "administrator",
                "user": user,
                "can_be_edited": False,
                "is_anonymous": False,
                "can_manage_chat": True,
                "can_delete_messages": True,
                "can_manage_video_chats": True,
                "can_restrict_members": True,
                "can_promote_members": False,
                "can_change_info": True,
                "can_invite_users": True,
                "can_post_stories": False,
                "can_edit_stories": False,
                "can_delete_stories": False,
                "can_pin_messages": True,
            }
        return {"status": "member", "user": user}

    async def get_chat_member(self, params: Params) -> Any:
        with self._lock:
            chat = find_chat(self._data, params)
            user_id = params.integer("user_id")
            if user_id is None:
                raise bad_request("user not found")
            return self._member(chat["id"], user_id)

    async def get_chat_administrators(self, params: Params) -> Any:
        with self._lock:
            chat = find_chat(self._data, params)
            if chat["type"] == "private":
                raise bad_request("there are no administrators in the private chat")
            owner = self._data.owners.get(chat["id"])
            ids = ([owner] if owner is not None else []) + [
                a for a in self._data.admins.get(chat["id"], []) if a != owner
            ]
            return [self._member(chat["id"], user_id) for user_id in ids]
