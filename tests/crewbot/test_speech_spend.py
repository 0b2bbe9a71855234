"""Speech to text in the spend reports: `crewbot stats` shows its audio and prices it by the minute
(STT_PRICE_PER_MINUTE), and /budget says how much audio was transcribed today."""

from __future__ import annotations

import json
from pathlib import Path

from bot.budget_command import BudgetCommand
from core.allowances import Allowances
from core.store.db import Database
from core.store.spend import SpendKind, SpendStore
from tests.crewbot.cli_env import crewbot_env, run_crewbot
from tests.harness import make_settings

CHAT = -3301


async def test_stats_and_budget_show_the_audio_transcribed(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = make_settings(data_dir, STT_PRICE_PER_MINUTE=0.006, LLM_PRICE_INPUT_PER_MTOK=3)
    db = await Database.open(settings.db_path)
    try:
        store = SpendStore(db)
        today = Allowances(settings, store).today()
        await store.add(today, CHAT, SpendKind.SPEECH, 100, 0, estimated=False, audio_seconds=30.0)
        await store.add(today, CHAT, SpendKind.SPEECH, 200, 0, estimated=False, audio_seconds=60.0)
        await store.add(today, CHAT, SpendKind.MAIN, 1_000, 100, estimated=False)
        shown = await BudgetCommand(Allowances(settings, store), settings).show(CHAT)
    finally:
        await db.close()
    assert "Speech to text: 2 call(s), 1:30 of audio. It counts in the tokens above." in shown
    assert "this chat used 1,400 LLM tokens" in shown

    env = crewbot_env(data_dir, STT_PRICE_PER_MINUTE="0.006", LLM_PRICE_INPUT_PER_MTOK="3")
    done = run_crewbot(["stats", "--since", "1d", "--json"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["spend"]
    speech = report["chats"][str(CHAT)]["kinds"]["speech"]
    assert (speech["calls"], speech["audio_seconds"], speech["input_tokens"]) == (2, 90.0, 300)
    assert abs(speech["money"] - 1.5 * 0.006) < 1e-9  # by the minute, not by its tokens
    assert report["prices"]["speech_per_minute"] == 0.006
    text = run_crewbot(["stats", "--since", "1d"], env, tmp_path).stdout
    assert "speech 300 in / 0 out (1:30 of audio)" in text and "speech 0.006 a minute" in text
