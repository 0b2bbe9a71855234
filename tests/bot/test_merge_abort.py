"""Abort-on-merge with a real OpenAI-compatible client: the aborted turn's HTTP request really closes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pydantic_ai.models import override_allow_model_requests

from core.store.messages import MessageStore
from tests.fakes.llm_server import FakeLLM, openai_text
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

HELD_SECONDS = 60.0  # "thinking" longer than any test runs: only a cancel ends these requests


class SlowThenFast:
    """The first `slow` requests hang (an LLM still thinking); later ones answer with what they saw."""

    def __init__(self, slow: int) -> None:
        self.slow = slow
        self.calls = 0
        self.prompts: list[str] = []

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        prompt = "\n".join(str(m.get("content")) for m in body["messages"])
        self.prompts.append(prompt)
        if self.calls <= self.slow:
            await asyncio.sleep(HELD_SECONDS)
        return openai_text(f"answer #{self.calls}")


def llm_settings(tmp_path: Path, tg: FakeTelegram, llm: FakeLLM, window_seconds: float) -> Any:
    return make_settings(
        tmp_path,
        tg,
        LLM_PROVIDER="openai",
        LLM_BASE_URL=llm.base_url,
        LLM_API_KEY="sk-test-merge",
        LLM_MODEL="fake-model",
        MERGE_WINDOW_SECONDS=window_seconds,
    )


async def test_merge_inside_window_closes_the_llm_request_and_answers_both(tmp_path: Path) -> None:
    script = SlowThenFast(slow=1)
    async with FakeTelegram() as tg, FakeLLM(api_key="sk-test-merge") as llm:
        llm.openai.handle_with(script)
        with override_allow_model_requests(True):
            async with telegram_app(llm_settings(tmp_path, tg, llm, 30)) as app:
                tg.push_message(GROUP_ID, f"@{tg.bot_username} first question", first_name="Ann")
                await llm.wait_for_requests(1)
                tg.push_message(GROUP_ID, f"@{tg.bot_username} and a second one", first_name="Ann")
                await llm.wait_for_disconnects(1)
                sent = await tg.wait_for_messages(GROUP_ID, 1)
                assert sent[0].plain_text == "Crew: answer #2"
                assert "first question" in script.prompts[1] and "and a second one" in script.prompts[1]
                await asyncio.sleep(0.3)
                assert len(tg.sent_messages(GROUP_ID)) == 1  # the aborted turn sent nothing
                await _wait_turns(app, ["aborted", "completed"])


async def test_two_merges_in_a_row_leave_one_answer_to_all_three(tmp_path: Path) -> None:
    script = SlowThenFast(slow=2)
    async with FakeTelegram() as tg, FakeLLM(api_key="sk-test-merge") as llm:
        llm.openai.handle_with(script)
        with override_allow_model_requests(True):
            async with telegram_app(llm_settings(tmp_path, tg, llm, 30)) as app:
                for n, text in enumerate(("one", "two", "three"), start=1):
                    tg.push_message(GROUP_ID, f"@{tg.bot_username} {text}")
                    await llm.wait_for_requests(n)
                await llm.wait_for_disconnects(2)
                sent = await tg.wait_for_messages(GROUP_ID, 1)
                assert sent[0].plain_text == "Crew: answer #3"
                assert all(word in script.prompts[2] for word in ("one", "two", "three"))
                await _wait_turns(app, ["aborted", "aborted", "completed"])


async def test_message_after_window_waits_and_is_answered_next_in_order(tmp_path: Path) -> None:
    script = SlowThenFast(slow=0)
    release = asyncio.Event()

    async def slow_first(body: dict[str, Any]) -> dict[str, Any]:
        if script.calls == 0:
            script.calls += 1
            await release.wait()
            return openai_text("answer to the first")
        return await script(body)

    async with FakeTelegram() as tg, FakeLLM(api_key="sk-test-merge") as llm:
        llm.openai.handle_with(slow_first)
        with override_allow_model_requests(True):
            async with telegram_app(llm_settings(tmp_path, tg, llm, 0.2)) as app:
                tg.push_message(GROUP_ID, f"@{tg.bot_username} first")
                await llm.wait_for_requests(1)
                await asyncio.sleep(0.4)  # past the merge window
                tg.push_message(GROUP_ID, f"@{tg.bot_username} second")
                await tg.wait_until(lambda: (len(MessageStore(app.stores.db).__dict__) and None) or True)
                release.set()
                sent = await tg.wait_for_messages(GROUP_ID, 2)
                assert [m.plain_text for m in sent] == ["Crew: answer to the first", "Crew: answer #2"]
                assert llm.disconnects == 0
                await _wait_turns(app, ["completed", "completed"])


async def _turn_statuses(app: Any) -> list[str]:
    async with app.stores.db.conn.execute("SELECT status FROM turns ORDER BY started_at") as cursor:
        return [row[0] for row in await cursor.fetchall()]


async def _wait_turns(app: Any, expected: list[str]) -> None:
    """Turn outcomes are recorded just after the reply is sent: wait for them, briefly."""
    for _ in range(100):
        if await _turn_statuses(app) == expected:
            return
        await asyncio.sleep(0.05)
    assert await _turn_statuses(app) == expected


async def _wait_stored(app: Any, count: int) -> None:
    store = MessageStore(app.stores.db)
    for _ in range(100):
        if await store.count(GROUP_ID) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} messages stored")
