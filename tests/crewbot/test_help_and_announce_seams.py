"""Help lists every command on its own line; an announcement replies to nothing rather than to an unrelated
message; docs/operating.md names every live setting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.commands import CONSOLE_HELP_TEXT, HELP_TEXT, KNOWN_COMMANDS
from core.store.messages import NewMessage
from tests.crewbot.test_announce import announcing_app, run_to_end, until
from tests.harness import GROUP_ID

pytestmark = pytest.mark.timeout(60)


def test_every_help_line_is_its_own_line() -> None:
    for text in (HELP_TEXT, CONSOLE_HELP_TEXT):
        for command in KNOWN_COMMANDS - {"start", "help"}:
            assert f"/{command}" in text
        # Each command's description starts a line: none is glued to the end of the one before.
        assert "\n/config" in text, text


async def test_an_announcement_does_not_reply_to_an_unrelated_later_message(tmp_path: Path) -> None:
    prompts: list[str] = []
    async with announcing_app(tmp_path, prompts) as (app, service):
        # Someone else's message that triggered (and was answered) earlier, unrelated to the run.
        await app.stores.messages.add(
            NewMessage(
                chat_id=GROUP_ID,
                sender_name="Bob",
                content="@crew what's for lunch?",
                sender_id=2002,
                platform_message_id=555,
                is_trigger=True,
                timestamp=time.time(),
            )
        )
        await run_to_end(service, "the report")  # started by no turn of Bob's
        await until(lambda: app.channel.texts(GROUP_ID))  # type: ignore[attr-defined]
        await app.wait_quiet(GROUP_ID)
        query = "SELECT trigger_message_id FROM turns ORDER BY started_at"
        async with app.stores.db.conn.execute(query) as cursor:
            answered = [row[0] for row in await cursor.fetchall()]
    # The announcing turn answers no message (its reply target is looked up from it), so it cannot reply to
    # Bob's lunch question.
    assert answered == [None], answered


def test_the_operating_page_names_every_live_setting_where_it_lists_them() -> None:
    from core.live_config import LIVE_SETTINGS
    from tests.test_docs import ROOT

    page = (ROOT / "docs" / "operating.md").read_text(encoding="utf-8")
    section = page.split("## Changing settings on the running bot", 1)[1].split("\n\n", 2)[1]
    assert [name for name in LIVE_SETTINGS if f"`{name}`" not in section] == []
