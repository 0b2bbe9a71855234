"""MAX_TASKS_PER_CHAT is the chat's: a forum's topics share one count."""

from __future__ import annotations

from pathlib import Path

from core.store.schedules import ScheduleStore
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import make_settings, telegram_app

FORUM_ID = -1_005_000_000_003


async def test_max_tasks_per_chat_holds_for_a_forum_across_its_topics(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        tg.add_chat(FORUM_ID, chat_type="supergroup", title="forum")
        tg.update_chat(FORUM_ID, is_forum=True)
        settings = make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=str(FORUM_ID), MAX_TASKS_PER_CHAT=1)
        async with telegram_app(settings) as app:
            for n, topic in enumerate((10, 20, 30), start=1):
                tg.push_message(FORUM_ID, f"@{tg.bot_username} schedule: every 1h $ date", thread_id=topic)
                await tg.wait_for_messages(FORUM_ID, n)
            store = ScheduleStore(app.stores.db)
            tasks = [t for c in await app.stores.chats.conversations_of(FORUM_ID) for t in await store.for_chat(c)]
            refusals = [m.plain_text for m in tg.sent_messages(FORUM_ID) if "the most it may have (1)" in m.plain_text]
    assert len(tasks) == 1
    assert len(refusals) == 2
