"""/config in a chat: operators (ADMIN_USER_IDS) see and change live settings, with the start-up line
when a value is refused; nobody else, not even a chat admin, may."""

from __future__ import annotations

import pytest

from core.settings import SettingsError, load_settings
from core.store.db import Database
from core.store.setting_overrides import SettingOverrideStore
from tests.bot.router_helpers import ADMIN, MEMBER, Bot, handle_command


async def test_an_operator_changes_a_cap_and_it_is_kept_with_who(bot: Bot, db: Database) -> None:
    reply = await handle_command(bot, "/config MAX_CONCURRENT_SUBAGENTS=7", sender_id=ADMIN)

    assert reply == "Crew: MAX_CONCURRENT_SUBAGENTS: 3 -> 7 (from the next run's start)"
    assert bot.settings.max_concurrent_subagents == 7
    store = SettingOverrideStore(db)
    assert await store.all() == {"MAX_CONCURRENT_SUBAGENTS": "7"}
    (change,) = await store.changes()
    assert change.changed_by == f"Telegram user {ADMIN} in chat -100777"


async def test_a_bad_value_is_refused_with_the_start_up_line(bot: Bot) -> None:
    with pytest.raises(SettingsError) as refused_at_start:
        load_settings(_env_file=None, SUBAGENT_MEMORY="lots")
    at_start = refused_at_start.value.lines
    reply = await handle_command(bot, "/config SUBAGENT_MEMORY=lots", sender_id=ADMIN)

    assert reply.removeprefix("Crew: ").splitlines() == at_start
    assert bot.settings.subagent_memory == "512m"


async def test_a_setting_that_needs_a_restart_is_refused(bot: Bot) -> None:
    reply = await handle_command(bot, "/config LLM_MODEL=gpt-5", sender_id=ADMIN)

    assert "LLM_MODEL cannot be changed on the running bot" in reply
    assert bot.settings.llm_model is None


async def test_a_chat_admin_who_is_not_an_operator_is_refused(bot: Bot) -> None:
    bot.channel.admin = True

    reply = await handle_command(bot, "/config MAX_CONCURRENT_SUBAGENTS=50", sender_id=MEMBER)

    assert reply == "Crew: Only the bot's operators (ADMIN_USER_IDS) can use /config."
    assert bot.settings.max_concurrent_subagents == 3


async def test_config_alone_lists_the_live_settings(bot: Bot) -> None:
    reply = await handle_command(bot, "/config", sender_id=ADMIN)

    assert "MAX_CONCURRENT_SUBAGENTS = 3 (default)" in reply
    assert "SUBAGENT_TIMEOUT_SECONDS = 900 (default)" in reply
    assert "LLM_MODEL" not in reply
