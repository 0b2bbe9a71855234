"""Who the prompt says wrote each line: the bot's own words are "(you)", what a subagent posted (its result, its
progress, a photo it sent) is the subagent's, even though the bot's account posted it."""

from __future__ import annotations

from pathlib import Path

from bot.agent.prompt import SUBAGENT_SENDER, build_prompt
from core.store.chat_files import FileKind, NewFile
from core.store.messages import NewMessage
from core.stores import Stores
from runner.runs.outcome import SUBAGENT_SENDER as RUNNER_SUBAGENT_SENDER
from tests.harness import make_settings

CHAT = -501


async def test_a_subagents_photo_is_labelled_as_the_subagents_not_the_bots(tmp_path: Path) -> None:
    stores = await Stores.open(make_settings(tmp_path))
    try:
        await stores.chats.ensure(CHAT, "group", "t")
        photo = NewFile(FileKind.PHOTO, "sent:r1:chart.png", "sent:r1:1", "chart.png", "image/png", 2_000)
        await stores.messages.add(NewMessage(CHAT, "Crew", "hello", is_bot=True))
        await stores.messages.add(NewMessage(CHAT, SUBAGENT_SENDER, "the chart", is_bot=True, kind="file", file=photo))
        prompt = await build_prompt(stores.messages, CHAT, 10, "Crew")
    finally:
        await stores.db.close()
    lines = prompt.text.splitlines()
    bot_line, photo_line = next(x for x in lines if "hello" in x), next(x for x in lines if "chart" in x)
    assert bot_line.endswith("Crew (you): hello")
    assert "] [Subagent]: [file f1: chart.png" in photo_line and "(you)" not in photo_line
    assert SUBAGENT_SENDER == RUNNER_SUBAGENT_SENDER  # the host's name for it, the same text
