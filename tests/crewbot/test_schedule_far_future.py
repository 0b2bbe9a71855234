"""Schedules at the edge of datetime's range: a chat member's one-off at the end of year 9999, in a chat
whose zone is west of UTC, and an interval of millions of days are refused in words; nothing is stored
that could stop the next start."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.schedules.book import TaskRequestError
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app


async def test_a_members_far_future_one_off_is_refused_and_the_next_start_works(tmp_path: Path) -> None:
    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg, TIMEZONE="America/New_York")
        async with telegram_app(settings) as app:
            tg.push_message(GROUP_ID, f"@{tg.bot_username} schedule: 9999-12-31T23:59 $ date", user_id=2002)
            (answer,) = await tg.wait_for_messages(GROUP_ID, 1)
            assert "100 years" in answer.plain_text, answer.plain_text
            assert await app.schedules.store.for_chat(GROUP_ID) == []
        async with telegram_app(settings):  # the next start (a deploy, a reboot, a crash)
            pass


@pytest.mark.parametrize("schedule", ["every 9999999d", "9999-12-31T23:59:00-12:00"])
async def test_a_schedule_beyond_the_horizon_is_refused_in_words(tmp_path: Path, schedule: str) -> None:
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg)) as app:
        await app.stores.chats.ensure(GROUP_ID, "group", "group")
        with pytest.raises(TaskRequestError, match="100 years"):
            await app.schedules.book.schedule(GROUP_ID, 1001, "report", schedule)
