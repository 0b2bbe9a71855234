"""`crewbot stats`' suggested CHAT_DAILY_TOKENS and DAILY_TOKENS: the p95 day times the headroom, rounded up
to a readable number, from the spend a real database holds; nothing with fewer than 3 days of it."""

from __future__ import annotations

import json
from pathlib import Path

from core.settings import Settings
from core.store.db import Database
from core.store.spend import SpendKind, SpendStore
from crewbot.allowance_advice import readable
from crewbot.stats_command import gather_spend
from tests.crewbot.cli_env import crewbot_env, run_crewbot
from tests.crewbot.test_spend_stats import CHAT, DAY, OTHER, ZONE, day_ago, spend
from tests.harness import make_settings

# CHAT's days, oldest first: its p95 day is 40,000 + 0.8 * (100,000 - 40,000) = 88,000 tokens.
BUSY = [10_000, 20_000, 30_000, 40_000, 100_000]
STEADY = 20_000  # OTHER's every day; the bot's days 30k..120k: p95 60,000 + 0.8 * 60,000 = 108,000


async def five_days(settings: Settings, *, quiet_chat: int | None = None) -> None:
    """BUSY for CHAT (half main, half subagent runs; in and out), STEADY for OTHER, on the last five days."""
    entries = []
    for n, tokens in enumerate(BUSY):
        day = day_ago(len(BUSY) - 1 - n)
        entries += [
            (day, CHAT, SpendKind.MAIN, tokens // 4, tokens // 4, False),
            (day, CHAT, SpendKind.SUBAGENT, tokens // 2 - 1_000, 1_000, n == 0),
            (day, OTHER, SpendKind.SCHEDULED, STEADY, 0, False),
        ]
    if quiet_chat is not None:
        entries.append((day_ago(2), quiet_chat, SpendKind.ANNOUNCE, 50_000, 10_000, False))
    await spend(settings, entries)


def test_suggestions_are_rounded_up_to_two_significant_digits() -> None:
    assert readable(132_000) == 140_000
    assert readable(180_000.0) == 180_000
    assert readable(185_184.5) == 190_000
    assert readable(99_999) == 100_000
    assert readable(1_234) == 1_300
    assert readable(0) == 1_000  # an allowance of nothing would stop a chat at its first turn


async def test_the_command_suggests_both_allowances_from_the_p95_days(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = make_settings(data_dir, TIMEZONE=ZONE)
    await five_days(settings)
    env = crewbot_env(data_dir, TIMEZONE=ZONE, CHAT_DAILY_TOKENS="50000")

    done = run_crewbot(["stats", "--since", "7d", "--json"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    suggestions = json.loads(done.stdout)["spend"]["suggestions"]
    chat, bot = suggestions["CHAT_DAILY_TOKENS"], suggestions["DAILY_TOKENS"]
    assert chat["p95_day_tokens"] == 88_000 and chat["busiest_chat"] == CHAT and chat["days"] == 5
    assert chat["suggested"] == 140_000  # 88,000 x 1.5 = 132,000, rounded up
    assert chat["current"] == 50_000 and chat["reached_current"] == 1  # CHAT's 100,000 day
    assert bot["p95_day_tokens"] == 108_000 and bot["suggested"] == 170_000  # 162,000 rounded up
    assert bot["current"] == 0 and bot["reached_current"] == 0

    done = run_crewbot(["stats", "--since", "7d"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        f"suggested CHAT_DAILY_TOKENS=140000: busiest chat's p95 day: 88,000 tokens over 5 days (chat {CHAT}), "
        "x1.5 headroom, rounded up; now 50,000, reached on 1 chat-day\n"
    ) in done.stdout
    assert (
        "suggested DAILY_TOKENS=170000: the bot's p95 day: 108,000 tokens over 5 days (all chats together), "
        "x1.5 headroom, rounded up; now 0 (no allowance)\n"
    ) in done.stdout
    assert "apply without a restart: crewbot config set CHAT_DAILY_TOKENS=140000 DAILY_TOKENS=170000" in done.stdout


async def test_fewer_than_three_days_suggest_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = make_settings(data_dir, TIMEZONE=ZONE)
    await spend(settings, [(day_ago(n), CHAT, SpendKind.MAIN, 900_000, 100_000, False) for n in range(2)])
    env = crewbot_env(data_dir, TIMEZONE=ZONE, DAILY_TOKENS="2000000")

    done = run_crewbot(["stats", "--since", "7d"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "CHAT_DAILY_TOKENS: nothing to suggest: spend recorded on 2 days, 3 needed; now 0 (no allowance)" in (
        done.stdout
    )
    assert "DAILY_TOKENS: nothing to suggest: spend recorded on 2 days, 3 needed; now 2,000,000" in done.stdout
    assert "CHAT_DAILY_TOKENS=" not in done.stdout and "DAILY_TOKENS=" not in done.stdout

    done = run_crewbot(["stats", "--since", "7d", "--json"], env, tmp_path)
    suggestions = json.loads(done.stdout)["spend"]["suggestions"]
    assert suggestions["CHAT_DAILY_TOKENS"]["suggested"] is None and suggestions["DAILY_TOKENS"]["suggested"] is None


async def test_a_silent_day_is_a_day_of_nothing(tmp_path: Path) -> None:
    """A chat that used 60,000 on one of five days has a p95 day of 0.8 x 60,000, not of 60,000."""
    quiet = -300
    settings = make_settings(tmp_path / "data", TIMEZONE=ZONE)
    await five_days(settings, quiet_chat=quiet)

    _, advice = await gather_spend(settings, 7 * DAY, quiet)

    assert advice.chat.p95 == 48_000 and advice.chat.suggested == 72_000
    assert f"chat {quiet}'s p95 day: 48,000 tokens over 5 days" in advice.chat.line


async def test_chats_with_their_own_allowance_are_left_out(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", TIMEZONE=ZONE)
    await five_days(settings)
    db = await Database.open(settings.db_path)
    try:
        await SpendStore(db).set_chat_allowance(CHAT, 500_000, set_by=1)
    finally:
        await db.close()

    _, advice = await gather_spend(settings, 7 * DAY, None)
    assert advice.chat.busiest_chat == OTHER and advice.chat.p95 == STEADY and advice.chat.suggested == 30_000
    assert advice.chat.line.endswith("1 chat with its own allowance left out")
    assert advice.bot.p95 == 108_000  # the bot's allowance counts every chat

    _, advice = await gather_spend(settings, 7 * DAY, CHAT)
    assert advice.chat.suggested is None
    assert "chat -100 has its own allowance (500,000 tokens a day), which CHAT_DAILY_TOKENS does not replace" in (
        advice.chat.line
    )


async def test_one_chat_asked_for_bases_the_chat_allowance_on_it_and_the_bots_on_all(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", TIMEZONE=ZONE, DAILY_TOKENS=100_000)

    await five_days(settings)
    _, advice = await gather_spend(settings, 7 * DAY, OTHER)

    assert advice.chat.p95 == STEADY and advice.chat.suggested == 30_000
    assert advice.bot.p95 == 108_000 and advice.bot.suggested == 170_000
    assert advice.bot.reached == 1 and advice.bot.line.endswith("now 100,000, reached on 1 day")
