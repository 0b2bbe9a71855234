"""Chats the bot does not work in leave nothing behind: a stranger's forum topics get no rows, and being
removed from a stranger's group keeps no state and stops nothing of ours."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.fakes.telegram_group_events import set_bot_membership
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import make_settings, telegram_app

FORUM_ID = -1_005_000_000_001
STRANGER_FORUM_ID = -1_006_000_000_009
WAIT_SECONDS = 20.0


async def test_a_not_allowed_forum_leaves_no_rows(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        tg.add_chat(STRANGER_FORUM_ID, chat_type="supergroup", title="stranger")
        tg.update_chat(STRANGER_FORUM_ID, is_forum=True)
        settings = make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=str(FORUM_ID))
        async with telegram_app(settings) as app:
            for topic in range(1, 21):
                tg.push_message(STRANGER_FORUM_ID, "hi", thread_id=topic)
            set_bot_membership(tg, STRANGER_FORUM_ID, "kicked")
            await tg.wait_until(lambda: not tg.pending_updates() or None, WAIT_SECONDS)
            await asyncio.sleep(0.3)  # the last update is confirmed with the next poll
            rows = await app.stores.chats.conversations_of(STRANGER_FORUM_ID)
            owed = await app.stores.outbox.counts()
    assert rows == [], f"{len(rows)} chats rows written for a chat that is not allowed"
    assert owed == {}
