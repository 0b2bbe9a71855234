"""The bot's own membership as Telegram reports it: a `my_chat_member` update, and a chat that answers
403 to everything once the bot is out of it (as the real API does)."""

from __future__ import annotations

import time

from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.telegram_state import JsonDict

ADMIN_WHO_ACTS = {"id": 424242, "is_bot": False, "first_name": "Admin"}


def _member(user: JsonDict, status: str) -> JsonDict:
    member: JsonDict = {"user": user, "status": status}
    if status == "kicked":
        member["until_date"] = 0
    return member


def set_bot_membership(tg: FakeTelegram, chat_id: int, status: str, chat_type: str = "supergroup") -> JsonDict:
    """`kicked` or `left`: the chat blocks the bot; `member` or `administrator`: it is back."""
    old_status = "member" if status in ("kicked", "left") else "left"
    if status in ("kicked", "left"):
        tg.block_chat(chat_id)
    else:
        tg.unblock_chat(chat_id)
    bot = tg.bot_user
    return tg.push_raw_update(
        {
            "my_chat_member": {
                "chat": {"id": chat_id, "type": chat_type, "title": f"chat {chat_id}"},
                "from": ADMIN_WHO_ACTS,
                "date": int(time.time()),
                "old_chat_member": _member(bot, old_status),
                "new_chat_member": _member(bot, status),
            }
        }
    )
