"""A turn asked for by a stored message (a scheduled prompt) while another turn runs answers that message:
its prompt ends there, not at the previous turn's trigger."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.offline import prompt_text
from core.store.schedules import FireStatus, TaskMode
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

pytestmark = pytest.mark.timeout(60)


async def test_a_message_task_due_during_a_turn_is_answered_by_the_next_turn(tmp_path: Path) -> None:
    prompts: list[str] = []
    gate = asyncio.Event()

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts.append(prompt_text(messages))
        if len(prompts) == 1:
            await gate.wait()  # the user's turn is still thinking when the task comes due
        return ModelResponse(parts=[TextPart(f"answer {len(prompts)}")])

    async with FakeTelegram() as tg:
        settings = make_settings(tmp_path, tg)
        async with telegram_app(settings, model=FunctionModel(respond)) as app:
            tg.push_message(GROUP_ID, f"@{tg.bot_username} what is the plan?")
            await tg.wait_until(lambda: prompts or None, 10)
            due = datetime.now(UTC) + timedelta(seconds=1)
            task = await app.schedules.book.schedule(
                GROUP_ID, 1001, "time to stand up", due.isoformat(), mode=TaskMode.MESSAGE
            )
            async with asyncio.timeout(10):
                while True:
                    if [f for f in await app.schedules.store.history(task.id) if f.status is FireStatus.DONE]:
                        break
                    await asyncio.sleep(0.05)
            gate.set()
            await tg.wait_for_messages(GROUP_ID, 2)
            await app.wait_quiet(GROUP_ID)
    assert len(prompts) == 2
    # The second turn was started for the scheduled prompt; it must see it as the message to answer.
    assert "time to stand up" in prompts[1], prompts[1]
