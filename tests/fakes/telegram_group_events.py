"""Group events as Telegram reports them: the bot's own membership (a `my_chat_member` update; a chat
answers 403 to everything once the bot is out of it) and a group's upgrade to a supergroup."""

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


def upgrade_group(tg: FakeTelegram, old_id: int, new_id: int, *, announce: bool = True) -> None:
    """The group becomes supergroup `new_id`: calls on the old id answer 400 with migrate_to_chat_id and,
    with `announce`, the service messages arrive (migrate_to_chat_id in the old group, then
    migrate_from_chat_id in the new one), as Telegram sends them."""
    title = f"chat {old_id}"
    tg.add_chat(new_id, chat_type="supergroup", title=title)
    tg.redirect_upgraded(old_id, new_id)
    if not announce:
        return
    now = int(time.time())
    tg.push_raw_update(
        {
            "message": {
                "message_id": 900_001,
                "from": ADMIN_WHO_ACTS,
                "chat": {"id": old_id, "type": "group", "title": title},
                "date": now,
                "migrate_to_chat_id": new_id,
            }
        }
    )
    tg.push_raw_update(
        {
            "message": {
                "message_id": 900_002,
                "from": ADMIN_WHO_ACTS,
                "chat": {"id": new_id, "type": "supergroup", "title": title},
                "date": now,
                "migrate_from_chat_id": old_id,
            }
        }
    )
