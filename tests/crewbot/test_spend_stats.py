"""`crewbot stats`' spend block: per day (in TIMEZONE) and chat, tokens by kind, calls, estimated calls and
money at the kinds' prices, totals per chat; from a real database through the real command."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from core.settings import Settings
from core.store.db import Database
from core.store.setting_overrides import SettingOverrideStore, now_change
from core.store.spend import SpendKind, SpendStore
from crewbot.stats_command import gather_spend
from tests.crewbot.cli_env import crewbot_env, run_crewbot
from tests.harness import make_settings

CHAT, OTHER = -100, -200
ZONE = "Asia/Tokyo"
DAY = 86_400.0


def day_ago(days: int, zone: str = ZONE, now: float | None = None) -> str:
    at = (time.time() if now is None else now) - days * DAY
    return datetime.fromtimestamp(at, ZoneInfo(zone)).strftime("%Y-%m-%d")


async def spend(
    settings: Settings, entries: list[tuple[str, int, SpendKind, int, int, bool]], *, times: int = 1
) -> None:
    """Each (day, chat, kind, input, output, estimated) recorded `times` times, as the bot records calls."""
    db = await Database.open(settings.db_path)
    try:
        store = SpendStore(db)
        for day, chat, kind, input_tokens, output_tokens, estimated in entries:
            for _ in range(times):
                await store.add(day, chat, kind, input_tokens, output_tokens, estimated=estimated)
    finally:
        await db.close()


def a_week(today: str, yesterday: str) -> list[tuple[str, int, SpendKind, int, int, bool]]:
    return [
        (yesterday, CHAT, SpendKind.MAIN, 10_000, 2_000, False),
        (yesterday, CHAT, SpendKind.SUBAGENT, 200_000, 20_000, False),
        (yesterday, OTHER, SpendKind.ANNOUNCE, 1_000, 500, True),
        (today, CHAT, SpendKind.MAIN, 5_000, 1_000, True),
        (today, CHAT, SpendKind.SCHEDULED, 100_000, 10_000, False),
    ]


async def test_the_command_shows_each_day_and_chat_by_kind_with_money_at_the_kinds_prices(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = make_settings(data_dir, TIMEZONE=ZONE)
    today, yesterday = day_ago(0), day_ago(1)
    await spend(settings, [*a_week(today, yesterday), (day_ago(9), CHAT, SpendKind.MAIN, 9, 9, False)])
    prices = {
        "TIMEZONE": ZONE,
        "LLM_PRICE_INPUT_PER_MTOK": "3",
        "LLM_PRICE_OUTPUT_PER_MTOK": "15",
        "SUBAGENT_PRICE_INPUT_PER_MTOK": "1",  # its output: the main's 15
    }

    done = run_crewbot(["stats", "--since", "7d", "--json"], crewbot_env(data_dir, **prices), tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["spend"]
    assert report["timezone"] == ZONE and report["until_day"] == today and report["since_day"] == day_ago(7)
    assert report["priced"] is True
    assert report["prices"]["subagent"] == {"input_per_mtok": 1.0, "output_per_mtok": 15.0}
    assert [(d["day"], d["chat_id"]) for d in report["days"]] == [(yesterday, OTHER), (yesterday, CHAT), (today, CHAT)]
    first = report["days"][1]
    assert first["kinds"]["main"] == {
        "input_tokens": 10_000,
        "output_tokens": 2_000,
        "tokens": 12_000,
        "calls": 1,
        "estimated_calls": 0,
        "money": pytest.approx(0.06),  # 10k at 3 + 2k at 15 per million
    }
    assert first["kinds"]["subagent"]["money"] == pytest.approx(0.5)  # 200k at 1 + 20k at 15
    assert first["money"] == pytest.approx(0.56) and first["tokens"] == 232_000 and first["calls"] == 2
    assert report["days"][0]["estimated_calls"] == 1 and list(report["days"][0]["kinds"]) == ["announce"]
    assert report["days"][2]["kinds"]["scheduled"]["money"] == pytest.approx(0.25)  # 100k at 1 + 10k at 15
    assert report["chats"][str(CHAT)]["tokens"] == 348_000  # the day 9 days ago is outside the week
    assert report["chats"][str(CHAT)]["calls"] == 4 and report["chats"][str(CHAT)]["estimated_calls"] == 1
    assert report["chats"][str(CHAT)]["money"] == pytest.approx(0.56 + 0.03 + 0.25)
    assert report["total"]["calls"] == 5 and report["total"]["money"] == pytest.approx(0.84 + 0.0105)

    done = run_crewbot(["stats", "--since", "7d"], crewbot_env(data_dir, **prices), tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"spend ({day_ago(7)} - {today}, days in {ZONE}); money at the configured prices" in done.stdout
    assert (
        f"  {yesterday} chat {CHAT}: main 10,000 in / 2,000 out, subagent 200,000 in / 20,000 out; "
        "232,000 tokens; 2 calls, 0 estimated; money 0.56"
    ) in done.stdout
    assert f"  {today} chat {CHAT}: main 5,000 in / 1,000 out, scheduled 100,000 in / 10,000 out" in done.stdout
    assert (
        f"  chat {OTHER} over the period: announce 1,000 in / 500 out; 1,500 tokens; 1 call, 1 estimated; money 0.01"
        in (done.stdout)
    )
    assert "  all chats over the period: " in done.stdout and "; 5 calls, 2 estimated; money 0.85" in done.stdout
    assert "$" not in done.stdout


async def test_without_prices_no_money_is_shown(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = make_settings(data_dir, TIMEZONE=ZONE)
    await spend(settings, a_week(day_ago(0), day_ago(1)))

    done = run_crewbot(["stats", "--since", "7d", "--json"], crewbot_env(data_dir, TIMEZONE=ZONE), tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["spend"]
    assert report["priced"] is False and report["total"]["money"] is None
    assert all(d["money"] is None for d in report["days"])

    done = run_crewbot(["stats", "--since", "7d"], crewbot_env(data_dir, TIMEZONE=ZONE), tmp_path)
    assert "no money shown: set LLM_PRICE_INPUT_PER_MTOK and LLM_PRICE_OUTPUT_PER_MTOK" in done.stdout
    assert "232,000 tokens; 2 calls, 0 estimated\n" in done.stdout


async def test_one_chat_is_shown_alone(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", TIMEZONE=ZONE)
    await spend(settings, a_week(day_ago(0), day_ago(1)))

    stats, _ = await gather_spend(settings, 7 * DAY, OTHER)

    assert [(d.day, d.chat_id) for d in stats.days] == [(day_ago(1), OTHER)]
    assert list(stats.chats) == [OTHER] and stats.total.total.tokens == 1_500


async def test_days_are_the_timezones(tmp_path: Path) -> None:
    """At 20:00 UTC it is already the next day at UTC+14 and still the same day at UTC-11."""
    now = datetime(2024, 5, 10, 20, 0, tzinfo=ZoneInfo("UTC")).timestamp()
    for zone, today in (("Pacific/Kiritimati", "2024-05-11"), ("Pacific/Pago_Pago", "2024-05-10")):
        settings = make_settings(tmp_path / zone.replace("/", "-"), TIMEZONE=zone)
        await spend(settings, [(day, CHAT, SpendKind.MAIN, 100, 10, False) for day in ("2024-05-10", "2024-05-11")])

        stats, _ = await gather_spend(settings, 3600.0, None, now=now)

        assert (stats.since_day, stats.until_day) == (today, today)
        assert [d.day for d in stats.days] == [today]  # a day after the zone's today is not in the period


async def test_the_live_prices_are_used(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data", TIMEZONE=ZONE)
    await spend(settings, [(day_ago(0), CHAT, SpendKind.MAIN, 1_000_000, 0, False)])
    db = await Database.open(settings.db_path)
    try:
        await SettingOverrideStore(db).set(now_change("LLM_PRICE_INPUT_PER_MTOK", "0", "2.5", "operator"))
    finally:
        await db.close()

    stats, _ = await gather_spend(settings, DAY, None)

    assert stats.total.total.money == pytest.approx(2.5)


async def test_nothing_recorded_says_so(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = make_settings(data_dir)
    db = await Database.open(settings.db_path)
    await db.close()

    done = run_crewbot(["stats", "--since", "1d"], crewbot_env(data_dir), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "days in UTC): no LLM calls recorded" in done.stdout
    assert "CHAT_DAILY_TOKENS: nothing to suggest: spend recorded on 0 days, 3 needed" in done.stdout
