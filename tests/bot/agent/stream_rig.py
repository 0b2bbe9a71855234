"""The streamed-answer tests' rig: the real app on real PTB against the fake Bot API, a fake LLM streaming at
a chosen pace, and what the chat saw (every write of the growing answer, with its time)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai.models import override_allow_model_requests

from crewbot.app import App
from crewbot.stream_record import CountStream
from tests.fakes.llm_server import FakeLLM, StreamPace
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

INTERVAL_SECONDS = 1.0  # STREAM_EDIT_INTERVAL_SECONDS in these tests (its lower bound)
API_KEY = "sk-test-stream"


@dataclass(frozen=True)
class Write:
    """One write the chat saw of the growing answer: a send or an edit of a message, and when."""

    message_id: int
    text: str
    at: float


def writes(tg: FakeTelegram, chat_id: int = GROUP_ID) -> list[Write]:
    """The chat's sendMessage and editMessageText, in the order they happened."""
    sent = [Write(m.message_id, m.plain_text, m.at) for m in tg.sent_messages(chat_id)]
    edited = [Write(e.message_id, e.plain_text, e.at) for e in tg.edits(chat_id)]
    return sorted(sent + edited, key=lambda w: w.at)


def shown(tg: FakeTelegram, chat_id: int = GROUP_ID) -> list[str]:
    """The bot's messages in the chat as they stand now, in order."""
    texts = []
    for sent in tg.sent_messages(chat_id):
        message = tg.message(chat_id, sent.message_id)
        if message is not None:
            texts.append(str(message["text"]))
    return texts


async def stored_answers(app: App, chat_id: int = GROUP_ID) -> list[tuple[str, str]]:
    """The bot's stored messages of the chat (content, kind), oldest first."""
    async with app.stores.db.conn.execute(
        "SELECT content, kind FROM messages WHERE chat_id = ? AND is_bot = 1 ORDER BY id", (chat_id,)
    ) as cursor:
        return [(str(row[0]), str(row[1])) for row in await cursor.fetchall()]


@asynccontextmanager
async def streaming_bot(
    tmp_path: Path, pace: StreamPace, count_stream: CountStream | None = None, **overrides: Any
) -> AsyncIterator[tuple[App, FakeTelegram, FakeLLM]]:
    async with FakeTelegram() as tg, FakeLLM(api_key=API_KEY) as llm:
        llm.set_stream_pace(pace)
        values: dict[str, Any] = {
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": llm.base_url,
            "LLM_API_KEY": API_KEY,
            "LLM_MODEL": "fake-model",
            "STREAM_REPLIES": "true",
            "STREAM_EDIT_INTERVAL_SECONDS": INTERVAL_SECONDS,
        }
        settings = make_settings(tmp_path, tg, **(values | overrides))
        with override_allow_model_requests(True):
            async with telegram_app(settings, count_stream=count_stream) as app:
                yield app, tg, llm
