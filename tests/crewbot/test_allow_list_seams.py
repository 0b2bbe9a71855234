"""ALLOWED_CHAT_IDS everywhere a conversation can act: a topic made after an upgrade is allowed by the
group's old id; a chat taken off the list gets no more scheduled messages."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic_ai.models.function import FunctionModel

from core.store.schedules import TaskMode
from tests.bot.test_topics_and_upgrades import NEW_SUPERGROUP_ID, OLD_GROUP_ID, TopicModel, answers
from tests.fakes.telegram_group_events import upgrade_group
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

pytestmark = pytest.mark.timeout(60)
TOPIC = 77


async def test_a_topic_of_an_upgraded_group_is_allowed_by_the_old_id(tmp_path: Path) -> None:
    # docs/telegram.md: "A topic is allowed by its chat's id" and "ALLOWED_CHAT_IDS may list the old id, the new one,
    # or both".
    async with FakeTelegram() as tg:
        tg.add_chat(OLD_GROUP_ID, chat_type="group", title="team")
        settings = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(OLD_GROUP_ID))
        async with telegram_app(settings, model=FunctionModel(TopicModel())):
            tg.push_message(OLD_GROUP_ID, f"@{tg.bot_username} q-before")
            await tg.wait_for_messages(OLD_GROUP_ID, 1)
            upgrade_group(tg, OLD_GROUP_ID, NEW_SUPERGROUP_ID)
            tg.update_chat(NEW_SUPERGROUP_ID, is_forum=True)  # the admins turn topics on in the new supergroup
            tg.push_message(NEW_SUPERGROUP_ID, f"@{tg.bot_username} q-general")
            await tg.wait_for_messages(NEW_SUPERGROUP_ID, 1)  # General (the old conversation) is answered
            tg.push_message(NEW_SUPERGROUP_ID, f"@{tg.bot_username} q-in-topic", thread_id=TOPIC)
            await tg.wait_until(lambda: answers(tg, NEW_SUPERGROUP_ID, TOPIC) or None, 10)


async def test_a_chat_taken_off_the_allow_list_gets_no_more_scheduled_messages(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        tg.add_chat(GROUP_ID, title="group")
        allowed = make_settings(tmp_path / "data", tg)
        async with telegram_app(allowed) as app:
            await app.stores.chats.ensure(GROUP_ID, "group", "group")
            due = datetime.now(UTC) + timedelta(seconds=3)
            await app.schedules.book.schedule(GROUP_ID, 1001, "daily nag", due.isoformat(), mode=TaskMode.MESSAGE)
        # The operator takes the chat off ALLOWED_CHAT_IDS and restarts: the bot must stay silent there.
        not_allowed = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS="-999")
        async with telegram_app(not_allowed) as app:
            await asyncio.sleep(5)
            await app.wait_quiet(GROUP_ID)
            sent = [m.plain_text for m in tg.sent_messages(GROUP_ID)]
    assert sent == [], sent
