"""Faults at the edges, through the real app: the LLM provider (a fake OpenAI-compatible server) rate
limits or fails, and Telegram's getUpdates errors or drops connections. The bot answers once, apologises
when the model stays down, and keeps going when the edge recovers."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic_ai.models import override_allow_model_requests

from bot.agent.main_agent import APOLOGY, LLM_MAX_RETRIES
from bot.agent.prompt import LATEST_MARKER
from core.store.messages import MessageStore
from tests.fakes.faults import Fault
from tests.fakes.llm_replies import JsonDict
from tests.fakes.llm_server import FakeLLM, openai_text
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import make_settings, telegram_app

WAIT_SECONDS = 30.0  # generous: SDK back-off and the poller's back-off add seconds on a loaded machine


def unique_group_id() -> int:
    return -(2_000_000_000 + secrets.randbelow(900_000_000))


def answer_latest(body: JsonDict) -> JsonDict:
    """The fake model answers with the latest message's text, so each reply names what it answers."""
    prompt = str(body["messages"][-1]["content"])
    latest = prompt.rpartition(LATEST_MARKER)[2].partition(":\n")[2].partition("\n\nWrite ")[0]
    return openai_text(f"answer to {latest.strip()}")


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM(api_key="sk-fault-test") as fake:
        fake.openai.handle_with(answer_latest)
        yield fake


async def test_llm_rate_limits_then_errors_then_recovers(tmp_path: Path, tg: FakeTelegram, llm: FakeLLM) -> None:
    chat = unique_group_id()
    tg.add_chat(chat, title="llm faults")
    settings = make_settings(
        tmp_path,
        tg,
        ALLOWED_CHAT_IDS=str(chat),
        LLM_PROVIDER="openai",
        LLM_BASE_URL=llm.base_url,
        LLM_API_KEY="sk-fault-test",
        LLM_MODEL="fake-model",
        LOG_LEVEL="INFO",
    )
    mention = f"@{tg.bot_username}"
    with override_allow_model_requests(True):
        async with telegram_app(settings) as app:
            # Two 429s with retry-after, then success: the SDK retries, the chat gets one reply.
            llm.fail_next(Fault.retry_after(1), count=2)
            tg.push_message(chat, f"{mention} first")
            (first,) = await tg.wait_for_messages(chat, 1, timeout_seconds=WAIT_SECONDS)
            assert first.plain_text == f"Crew: answer to {mention} first"
            assert len(llm.requests("/v1/chat/completions")) == 3
            await app.wait_quiet(chat)

            # 500s on every attempt the SDK makes: a short apology, stored like any reply.
            llm.fail_next(Fault.server_error(), count=LLM_MAX_RETRIES + 1)
            tg.push_message(chat, f"{mention} second")
            sent = await tg.wait_for_messages(chat, 2, timeout_seconds=WAIT_SECONDS)
            assert sent[1].plain_text == f"Crew: {APOLOGY}"
            assert len(llm.requests("/v1/chat/completions")) == 3 + LLM_MAX_RETRIES + 1
            await app.wait_quiet(chat)

            # The model works again: the next message is answered normally.
            tg.push_message(chat, f"{mention} third")
            sent = await tg.wait_for_messages(chat, 3, timeout_seconds=WAIT_SECONDS)
            assert sent[2].plain_text == f"Crew: answer to {mention} third"
            await app.wait_quiet(chat)
            assert len(tg.sent_messages(chat)) == 3
            stored = await MessageStore(app.stores.db).recent(chat, 10)
            assert [(m.is_bot, m.kind) for m in stored] == [
                (False, "text"),
                (True, "reply"),
                (False, "text"),
                (True, "notice"),
                (False, "text"),
                (True, "reply"),
            ]


async def test_get_updates_errors_and_dropped_connections_then_polling_resumes(
    tmp_path: Path, tg: FakeTelegram
) -> None:
    chat = unique_group_id()
    tg.add_chat(chat, title="polling faults")
    settings = make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=str(chat), LOG_LEVEL="INFO")
    mention = f"@{tg.bot_username}"
    async with telegram_app(settings) as app:
        tg.push_message(chat, f"{mention} before #b")
        await tg.wait_for_messages(chat, 1, timeout_seconds=WAIT_SECONDS)

        # The poll in flight answers normally; the next ones fail in three different ways.
        for fault in (Fault.server_error("Bad Gateway"), Fault.disconnect(), Fault.retry_after(1)):
            tg.fail_next("getUpdates", fault)
        polls = tg.call_count("getUpdates")
        await tg.wait_for_requests("getUpdates", polls + 1, timeout_seconds=WAIT_SECONDS)  # first fault served
        tg.push_message(chat, "not for the bot, but stored")
        tg.push_message(chat, f"{mention} during #d")
        sent = await tg.wait_for_messages(chat, 2, timeout_seconds=WAIT_SECONDS)
        assert tg.call_count("getUpdates") >= polls + 4  # three faulted polls, then a good one
        assert "#d" in sent[1].plain_text

        tg.push_message(chat, f"{mention} after #a")
        sent = await tg.wait_for_messages(chat, 3, timeout_seconds=WAIT_SECONDS)
        assert "#a" in sent[2].plain_text
        await app.wait_quiet(chat)
        assert len(tg.sent_messages(chat)) == 3  # each answered once
        stored = [m.content for m in await MessageStore(app.stores.db).recent(chat, 20) if not m.is_bot]
        assert stored == [
            f"{mention} before #b",
            "not for the bot, but stored",
            f"{mention} during #d",
            f"{mention} after #a",
        ]
