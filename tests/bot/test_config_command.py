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


@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        ("SUBAGENT_CPUS=1e-10", "invalid setting SUBAGENT_CPUS: must be a number from 0.01 to "),  # no CPU limit
        ("SUBAGENT_CPUS=1e300", "invalid setting SUBAGENT_CPUS: must be a number from 0.01 to "),  # every run fails
        (
            "SUBAGENT_TIMEOUT_SECONDS=inf",
            "invalid setting SUBAGENT_TIMEOUT_SECONDS: must be a number from 0.5 to 86400",
        ),
        (
            "SUBAGENT_TIMEOUT_SECONDS=nan",
            "invalid setting SUBAGENT_TIMEOUT_SECONDS: must be a number from 0.5 to 86400",
        ),
        ("SUBAGENT_MEMORY=99999999999999999g", "invalid setting SUBAGENT_MEMORY: must be digits with an optional unit"),
        ("MAX_SUBAGENTS_PER_CHAT=-1", "invalid setting MAX_SUBAGENTS_PER_CHAT: must be a whole number from 1 to 100"),
        ("SUBAGENT_QUEUE_LIMIT=1e300", "invalid setting SUBAGENT_QUEUE_LIMIT: must be a whole number from 0 to 1000"),
    ],
)
async def test_a_value_that_would_switch_a_limit_off_is_refused_naming_the_range(
    bot: Bot, db: Database, assignment: str, expected: str
) -> None:
    before = bot.settings.model_dump()

    reply = await handle_command(bot, f"/config {assignment}", sender_id=ADMIN)

    (line,) = reply.removeprefix("Crew: ").splitlines()
    value = assignment.split("=", 1)[1]
    assert line.startswith(expected) and line.endswith(f"(got {value!r})")
    if assignment.startswith("SUBAGENT_MEMORY"):
        assert "from 6m to " in line
    assert bot.settings.model_dump() == before
    assert await SettingOverrideStore(db).all() == {}
