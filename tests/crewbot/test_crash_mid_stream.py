"""A crash while an answer is being written (issue 36): the bot runs as the real `crewbot run` (the crash rig of
test_crash_recovery.py, chat side only: no Docker engine), streams from a slow fake LLM into a group, and is
SIGKILLed (or stopped with SIGTERM) mid-stream. The next start answers the question into that same message,
or, when the chat is not one the bot works in any more, finishes it as interrupted: one message, no Stop
button left, nothing doubled."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.agent.live_restart import INTERRUPTED_KIND
from bot.card_presses import NOT_WRITING
from tests.bot.agent.stream_rig import shown
from tests.crewbot.test_crash_recovery import (
    BotProcess,
    bot_env,
    query,
    tg,  # noqa: F401  (the fixture, used by name)
    unique_group_ids,
    until,
)
from tests.fakes.llm_server import FakeLLM, StreamPace, openai_text
from tests.fakes.telegram_server import FakeTelegram

API_KEY = "sk-test-crash-stream"
ASKER = 1001
QUESTION = "explain the plan slowly"
# About 2,600 characters at 4 every 50 ms: more than 30 s of writing, far longer than the test waits to kill.
LONG = "This answer is written slowly, and the bot dies before it is done. " * 40
SLOW = StreamPace(piece_chars=4, seconds_per_piece=0.05)
FAST = StreamPace(piece_chars=16, seconds_per_piece=0.01)
AFTER = "The whole answer, written after the restart into the same message."
MARK = "(interrupted by a restart)"


class Answers:
    """The first model request streams LONG; every later one AFTER."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return openai_text(LONG if self.calls == 1 else AFTER)


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(api_key=API_KEY) as fake:  # on its own thread: the bot is another process
        fake.set_stream_pace(SLOW)
        fake.openai.handle_with(Answers())
        yield fake


def streaming_env(telegram: FakeTelegram, llm: FakeLLM, data_dir: Path, chats: list[int]) -> dict[str, str]:
    env = bot_env(telegram, data_dir, chats, image="crewbot-agent:unused")
    env.update(
        LLM_PROVIDER="openai",
        LLM_BASE_URL=llm.base_url,
        LLM_API_KEY=API_KEY,
        LLM_MODEL="fake-model",
        STREAM_REPLIES="true",
        STREAM_EDIT_INTERVAL_SECONDS="1",
        # No engine: this is the chat side, and must not touch a real engine's containers.
        DOCKER_HOST=f"unix://{data_dir.parent}/no-docker-engine.sock",
    )
    return env


async def killed_mid_stream(
    bot: BotProcess, telegram: FakeTelegram, db: Path, chat_id: int, recorded_chars: int = 1, *, sigterm: bool = False
) -> tuple[int, str]:
    """Ask, wait until the growing message is on screen and recorded with `recorded_chars` of text, SIGKILL
    the bot (SIGTERM with `sigterm`: a clean stop); the message's id and its Stop button's data."""
    bot.start()
    telegram.push_message(chat_id, f"@{telegram.bot_username} {QUESTION}", user_id=ASKER, first_name="Ann")
    sent = await until("the first words on screen", lambda: telegram.sent_messages(chat_id), bot)
    live_id = sent[0].message_id

    def recorded() -> bool:
        rows = query(db, "SELECT part_ids, text FROM live_messages")
        return bool(rows) and json.loads(rows[0]["part_ids"]) == [live_id] and len(rows[0]["text"]) >= recorded_chars

    await until("the growing message recorded", recorded, bot)
    await until("an edit of it", lambda: telegram.edits(chat_id), bot)
    [stop] = telegram.buttons(chat_id, live_id)
    if sigterm:
        await asyncio.to_thread(bot.stop)
        assert bot.proc is not None and bot.proc.returncode == 0, f"SIGTERM should end it cleanly; see {bot.log_path}"
    else:
        bot.kill()
    on_screen = shown(telegram, chat_id)
    assert len(on_screen) == 1 and on_screen[0].endswith("…") and len(on_screen[0]) < len(LONG)
    assert not query(db, "SELECT id FROM messages WHERE is_bot = 1")  # nothing of the answer was stored
    return live_id, str(stop["callback_data"])


def settled(db: Path) -> bool:
    """No record of a growing answer left, and nothing owed to a chat."""
    return not query(db, "SELECT 1 FROM live_messages") and not query(db, "SELECT 1 FROM outbox WHERE status != 'sent'")


@pytest.mark.parametrize("sigterm", [False, True], ids=["sigkill", "sigterm"])
async def test_a_stop_mid_stream_is_answered_into_the_same_message(
    tmp_path: Path,
    tg: FakeTelegram,  # noqa: F811  (the imported fixture)
    llm: FakeLLM,
    sigterm: bool,
) -> None:
    (chat_id,) = unique_group_ids(1)
    tg.add_chat(chat_id, title="crash mid-stream")
    data_dir = tmp_path / "data"
    db = data_dir / "crewbot.sqlite3"
    bot = BotProcess(streaming_env(tg, llm, data_dir, [chat_id]), tmp_path)
    try:
        live_id, stop_data = await killed_mid_stream(bot, tg, db, chat_id, sigterm=sigterm)
        llm.set_stream_pace(FAST)
        bot.start()

        await until("the answer in the message", lambda: shown(tg, chat_id) == [f"Crew: {AFTER}"], bot)
        await until("the record ended and nothing owed", lambda: settled(db), bot)
        assert [m.message_id for m in tg.sent_messages(chat_id)] == [live_id]  # one message, never two answers
        assert tg.buttons(chat_id, live_id) == []  # no Stop left on it
        stored = query(db, "SELECT content, kind FROM messages WHERE is_bot = 1")
        assert [tuple(row) for row in stored] == [(AFTER, "reply")]  # stored once
        requests = llm.requests()
        assert len(requests) == 2 and QUESTION in json.dumps(requests[1].body)  # the question, asked again

        # The Stop of the answer from before the restart: an alert that it is not being written any more.
        pressed = tg.push_callback_query(chat_id, live_id, stop_data, user_id=ASKER, first_name="Ann")
        answer = await tg.wait_for_answer(pressed, timeout_seconds=30)
        assert answer.show_alert and answer.text == NOT_WRITING
        assert shown(tg, chat_id) == [f"Crew: {AFTER}"]
    finally:
        await asyncio.to_thread(bot.stop)


async def test_a_sigkill_mid_stream_in_a_chat_no_longer_allowed_is_marked_interrupted(
    tmp_path: Path,
    tg: FakeTelegram,  # noqa: F811  (the imported fixture)
    llm: FakeLLM,
) -> None:
    chat_id, other_id = unique_group_ids(2)
    tg.add_chat(chat_id, title="crash mid-stream, then disallowed")
    data_dir = tmp_path / "data"
    db = data_dir / "crewbot.sqlite3"
    env = streaming_env(tg, llm, data_dir, [chat_id])
    bot = BotProcess(env, tmp_path)
    try:
        # Past the first words: the recorded text is brought up to date while the answer grows.
        live_id, _ = await killed_mid_stream(bot, tg, db, chat_id, recorded_chars=len(LONG) // 20)
        (recorded,) = query(db, "SELECT text FROM live_messages")
        env["ALLOWED_CHAT_IDS"] = str(other_id)  # the operator took the chat off the list meanwhile
        bot.start()

        await until("the message finished as interrupted", lambda: shown(tg, chat_id)[0].endswith(MARK), bot)
        await until("the record ended and nothing owed", lambda: settled(db), bot)
        [final] = shown(tg, chat_id)
        assert final == f"Crew: {recorded['text']}\n\n{MARK}"  # the text as recorded, no "…"
        assert final.startswith("Crew: This answer is written slowly")
        assert [m.message_id for m in tg.sent_messages(chat_id)] == [live_id]
        assert tg.buttons(chat_id, live_id) == []
        stored = query(db, "SELECT kind FROM messages WHERE is_bot = 1")
        assert [row["kind"] for row in stored] == [INTERRUPTED_KIND]
        assert len(llm.requests()) == 1  # not answered: the chat is not one the bot works in
    finally:
        await asyncio.to_thread(bot.stop)
