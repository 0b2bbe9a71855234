"""Abort-on-merge and cancel commands with real containers: what the chat and the engine see."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.offline import prompt_text
from container.protocol import SpawnRequest
from core.store.messages import MessageStore
from core.store.runs import RunRecord, RunStore
from core.store.turns import TurnStatus
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS, final, labelled_containers, wait_for_runs

pytestmark = pytest.mark.docker

LATEST = "Latest message, from "


class SpawningModel:
    """A main agent that spawns on `background:`; with `hold` in the task it then keeps thinking
    (the turn stays in flight until a merge aborts it). Other messages get a plain answer."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.never = asyncio.Event()

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in last.parts):
            call = next(p for m in messages for p in m.parts if isinstance(p, ToolCallPart))
            if "hold" in str(call.args):
                await self.never.wait()
            return ModelResponse(parts=[TextPart("started it")])
        prompt = prompt_text(messages)
        self.prompts.append(prompt)
        latest = prompt.rsplit(LATEST, 1)[1].split(":\n", 1)[1].split("\n\nWrite ", 1)[0]
        if "background:" in latest:
            task = latest.split("background:", 1)[1].strip()
            return ModelResponse(parts=[ToolCallPart("spawn_subagent", {"task": task, "label": task[:20]})])
        return ModelResponse(parts=[TextPart(f"plain answer ({len(prompt)} chars of prompt)")])


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        fake.add_chat(GROUP_ID, title="merge tests")
        yield fake


async def wait_running(runs: RunStore, count: int) -> list[RunRecord]:
    """Until `count` runs of the chat have a container that the engine reports running."""
    deadline = time.monotonic() + RUN_WAIT_SECONDS
    while time.monotonic() < deadline:
        records = [r for r in await runs.for_chat(GROUP_ID, 50) if r.status == "running" and r.container_id]
        running_ids = {c.id for c in await asyncio.to_thread(labelled_containers, GROUP_ID) if c.status == "running"}
        if len([r for r in records if r.container_id in running_ids]) >= count:
            return records
        await asyncio.sleep(0.1)
    raise AssertionError("containers did not start")


async def wait_gone(container_id: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        containers = await asyncio.to_thread(labelled_containers, GROUP_ID)
        if all(c.id != container_id for c in containers):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"container {container_id[:12]} still exists")


async def wait_engine_idle(app: Any) -> None:
    for _ in range(200):
        if app.engine.idle(GROUP_ID):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the chat's turn did not end")


async def cancel_all(tg: FakeTelegram) -> None:
    tg.push_message(GROUP_ID, "/cancel all", user_id=1, first_name="Op")


async def test_merge_in_window_kills_the_subagent_and_answers_both(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    model = SpawningModel()
    settings = make_settings(tmp_path, tg, MERGE_WINDOW_SECONDS=60)
    async with telegram_app(settings, model=FunctionModel(model), with_subagents=True) as app:
        runs = RunStore(app.stores.db)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: hold\n$ sleep 300")
        (record,) = await wait_running(runs, 1)
        assert record.container_id is not None
        tg.push_message(GROUP_ID, f"@{tg.bot_username} oh, and check the logs too")
        await wait_gone(record.container_id)
        cancelled = await runs.get(record.id)
        assert cancelled is not None and cancelled.status == "cancelled"
        answer = await tg.wait_for_messages(GROUP_ID, 1)
        assert answer[0].plain_text.startswith("Crew: plain answer")
        # The new turn saw both messages.
        assert "background: hold" in model.prompts[-1] and "check the logs too" in model.prompts[-1]
        stored = await MessageStore(app.stores.db).recent(GROUP_ID, 20)
        assert not [m for m in stored if m.kind == "subagent"]
        assert not any("[Task:" in m.plain_text for m in tg.sent_messages(GROUP_ID))
        assert (settings.data_dir / "runs" / record.id / "container.log").exists()  # logs kept
        await app.typing.wait_idle(GROUP_ID)


async def test_message_after_window_lets_the_subagent_finish(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    model = SpawningModel()
    settings = make_settings(tmp_path, tg, MERGE_WINDOW_SECONDS=0.5)
    async with telegram_app(settings, model=FunctionModel(model), with_subagents=True) as app:
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ sleep 3 && echo survived-it")
        await wait_running(RunStore(app.stores.db), 1)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} unrelated question")
        (record,) = await wait_for_runs(RunStore(app.stores.db), GROUP_ID, 1, final, RUN_WAIT_SECONDS)
        assert record.status == "completed"
        result = await tg.wait_until(
            lambda: next((m for m in tg.sent_messages(GROUP_ID) if "survived-it" in m.plain_text), None)
        )
        assert result.plain_text.startswith("Crew: [Task:")
        texts = [m.plain_text for m in tg.sent_messages(GROUP_ID)]
        assert "Crew: started it" in texts and any(t.startswith("Crew: plain answer") for t in texts)


@pytest.mark.parametrize("scope", ["turn", "chat"])
async def test_cancel_scope_decides_whether_older_subagents_go(
    tmp_path: Path, tg: FakeTelegram, scope: str, subagent_image: str
) -> None:
    model = SpawningModel()
    settings = make_settings(tmp_path, tg, MERGE_WINDOW_SECONDS=60, MERGE_CANCEL_SCOPE=scope, ADMIN_USER_IDS="1")
    async with telegram_app(settings, model=FunctionModel(model), with_subagents=True) as app:
        runs = RunStore(app.stores.db)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ sleep 300")  # older, its turn completes
        (older,) = await wait_running(runs, 1)
        await tg.wait_for_messages(GROUP_ID, 1)
        # A minute-long window would merge the next message into the older turn if it were in flight.
        await wait_engine_idle(app)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: hold\n$ sleep 300")
        records = await wait_running(runs, 2)
        newer = next(r for r in records if r.id != older.id)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} never mind that")
        assert newer.container_id is not None
        await wait_gone(newer.container_id)
        await tg.wait_until(
            lambda: next((m for m in tg.sent_messages(GROUP_ID) if m.plain_text.startswith("Crew: plain answer")), None)
        )
        older_now = await runs.get(older.id)
        assert older_now is not None
        if scope == "chat":
            assert older_now.status == "cancelled"
        else:
            assert older_now.status == "running"
            await cancel_all(tg)
            await wait_for_runs(runs, GROUP_ID, 2, final, RUN_WAIT_SECONDS)


async def test_request_cancelled_before_pickup_never_starts(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    settings = make_settings(tmp_path, tg)
    async with telegram_app(settings, with_subagents=True) as app:
        chat = await app.stores.chats.ensure(GROUP_ID, "supergroup", "merge tests")
        turn_id = secrets.token_hex(6)
        await app.stores.turns.start(turn_id, GROUP_ID)
        await app.stores.turns.end(turn_id, TurnStatus.ABORTED)  # the merge landed while the request was written
        ipc_root = settings.data_dir / "ipc"
        ensure_chat_dirs(ipc_root, chat.folder)
        request = SpawnRequest(request_id=f"late-{secrets.token_hex(4)}", task="$ echo must not run", turn_id=turn_id)
        write_spawn_request(ipc_root, chat.folder, request)
        (record,) = await wait_for_runs(RunStore(app.stores.db), GROUP_ID, 1, final, RUN_WAIT_SECONDS)
        assert record.status == "cancelled" and record.container_id is None and record.started_at is None
        assert not await asyncio.to_thread(labelled_containers, GROUP_ID)
        assert not any("[Task:" in m.plain_text for m in tg.sent_messages(GROUP_ID))


async def test_cancel_needs_an_admin_and_then_kills(tmp_path: Path, tg: FakeTelegram, subagent_image: str) -> None:
    admin, member = 7001, 7002
    tg.set_chat_admins(GROUP_ID, [admin])
    settings = make_settings(tmp_path, tg)
    async with telegram_app(settings, with_subagents=True) as app:
        runs = RunStore(app.stores.db)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ sleep 300", user_id=member, first_name="Mo")
        (record,) = await wait_running(runs, 1)
        tg.push_message(GROUP_ID, f"/cancel {record.id}", user_id=member, first_name="Mo")
        refusal = await tg.wait_until(
            lambda: next((m for m in tg.sent_messages(GROUP_ID) if "Only chat admins" in m.plain_text), None)
        )
        assert "/cancel" in refusal.plain_text
        still = await runs.get(record.id)
        assert still is not None and still.status == "running"

        tg.push_message(GROUP_ID, "/subagents", user_id=member, first_name="Mo")
        listing = await tg.wait_until(
            lambda: next((m for m in tg.sent_messages(GROUP_ID) if "Subagent runs" in m.plain_text), None)
        )
        assert record.id in listing.plain_text and "running" in listing.plain_text

        tg.push_message(GROUP_ID, f"/cancel {record.id}", user_id=admin, first_name="Ada")
        done = await tg.wait_until(
            lambda: next((m for m in tg.sent_messages(GROUP_ID) if f"Cancelled run {record.id}" in m.plain_text), None)
        )
        assert done is not None
        assert record.container_id is not None
        await wait_gone(record.container_id)
        after = await runs.get(record.id)
        assert after is not None and after.status == "cancelled"
