"""Replies owed across a group's upgrade: the old group's message ids name other messages in the supergroup,
so what was owed is sent plainly instead."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic_ai.models.function import FunctionModel

from tests.bot.test_topics_and_upgrades import NEW_SUPERGROUP_ID, OLD_GROUP_ID, WAIT_SECONDS, TopicModel
from tests.fakes.telegram_group_events import upgrade_group
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import make_settings, telegram_app

pytestmark = pytest.mark.timeout(60)


async def test_an_answer_owed_across_an_upgrade_does_not_reply_to_an_unrelated_supergroup_message(
    tmp_path: Path,
) -> None:
    model = TopicModel(hold_word="q-held")
    async with FakeTelegram() as tg:
        tg.add_chat(OLD_GROUP_ID, chat_type="group", title="team")
        settings = make_settings(tmp_path / "data", tg, ALLOWED_CHAT_IDS=str(OLD_GROUP_ID))
        async with telegram_app(settings, model=FunctionModel(model)) as app:
            asked = tg.push_message(OLD_GROUP_ID, f"@{tg.bot_username} q-held what is the plan?")
            assert asked["message"]["message_id"] == 1
            await tg.wait_until(lambda: model.prompts or None, WAIT_SECONDS)
            upgrade_group(tg, OLD_GROUP_ID, NEW_SUPERGROUP_ID)
            chatter = tg.push_message(NEW_SUPERGROUP_ID, "lunch anyone?", user_id=2002, first_name="Bob")
            assert chatter["message"]["message_id"] == 1  # the supergroup numbers afresh
            # The bot handles updates in order: once Bob's message is stored, the upgrade was handled too.
            async with asyncio.timeout(WAIT_SECONDS):
                while True:
                    if any("lunch" in m.content for m in await app.stores.messages.recent(OLD_GROUP_ID, 5)):
                        break
                    await asyncio.sleep(0.05)
            model.release.set()  # the answer was being written all along: it goes out after the upgrade
            [answer] = await tg.wait_for_messages(NEW_SUPERGROUP_ID, 1)
            await app.wait_quiet(OLD_GROUP_ID)
    # Message 1 of the supergroup is Bob's lunch question, not the question this answers.
    assert answer.reply_to_message_id is None, answer
