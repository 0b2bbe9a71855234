"""Subagents for real: fake Telegram at the edge, real PTB, real SQLite, the real engine and image."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.offline import offline_main_model, prompt_text
from container.protocol import SpawnRequest
from core.store.messages import MessageStore
from core.store.runs import RunRecord, RunStore
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from runner.runtimes.runtime import LABEL_CHAT_ID, LABEL_RUN_ID
from tests.fakes.llm_server import FakeLLM, openai_text, openai_tool_call
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

pytestmark = pytest.mark.docker

RUN_WAIT_SECONDS = 90.0  # a container's Python start-up is slow on a loaded 2-core machine


class PromptRecorder:
    """The offline demo model, with every prompt it is given kept for assertions."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self._offline = offline_main_model("Crew")

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.prompts.append(prompt_text(messages))
        assert self._offline.function is not None
        result = self._offline.function(messages, info)
        assert isinstance(result, ModelResponse)
        return result


async def wait_for_runs(
    runs: RunStore, chat_id: int, count: int, done: Callable[[RunRecord], bool], timeout_seconds: float
) -> list[RunRecord]:
    deadline = time.monotonic() + timeout_seconds
    while True:
        records = await runs.for_chat(chat_id, 100)
        if len(records) >= count and all(done(r) for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"runs not finished: {[(r.id, r.status) for r in records]}")
        await asyncio.sleep(0.2)


def final(record: RunRecord) -> bool:
    return record.status not in ("queued", "running")


def labelled_containers(chat_id: int) -> list[Any]:
    client = docker.from_env()
    try:
        # sparse: the list call alone, with no per-container inspect that races with removal
        return list(client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_CHAT_ID}={chat_id}"}))
    finally:
        client.close()


async def until_no_containers(chat_id: int, timeout_seconds: float = 30.0) -> None:
    """The run's message goes out as soon as its outcome is recorded; removal of its container follows."""
    deadline = time.monotonic() + timeout_seconds
    while await asyncio.to_thread(labelled_containers, chat_id):
        if time.monotonic() > deadline:
            raise AssertionError(f"containers of chat {chat_id} still there after {timeout_seconds:g} s")
        await asyncio.sleep(0.2)


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


async def test_background_work_round_trip(tmp_path: Path, tg: FakeTelegram, subagent_image: str) -> None:
    recorder = PromptRecorder()
    settings = make_settings(tmp_path, tg, TYPING_INTERVAL_SECONDS=0.3)
    async with telegram_app(settings, model=FunctionModel(recorder), with_subagents=True) as app:
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ sleep 2 && echo crunched $((6 * 7))")

        def result_message() -> Any:
            return next((m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None)

        result = await tg.wait_until(result_message, timeout_seconds=RUN_WAIT_SECONDS)
        finished_at = time.monotonic()
        sent = [m.plain_text for m in tg.sent_messages(GROUP_ID)]
        assert sent[0].startswith("Crew: Started subagent run ")
        assert result.plain_text.startswith("Crew: [Task: sleep 2 && echo crunched")
        assert "crunched 42" in result.plain_text

        # Stored as the bot's own [Subagent] message, and the run record is complete.
        stored = [m for m in await MessageStore(app.stores.db).recent(GROUP_ID, 20) if m.kind == "subagent"]
        assert len(stored) == 1 and stored[0].sender_name == "[Subagent]" and stored[0].is_bot
        assert stored[0].content.startswith("[Task: sleep 2 && echo crunched") and "crunched 42" in stored[0].content
        (record,) = await RunStore(app.stores.db).for_chat(GROUP_ID, 10)
        assert record.status == "completed" and record.container_id and record.turn_id
        assert record.llm_requests >= 2 and record.input_tokens > 0

        # Typing was sent again and again while the container ran, and stopped after.
        actions = tg.chat_actions(GROUP_ID)
        assert len(actions) >= 5 and all(a.action == "typing" for a in actions)
        await asyncio.sleep(1.0)
        late = [a for a in tg.chat_actions(GROUP_ID) if a.at > finished_at + settings.typing_interval_seconds]
        assert late == []
        await until_no_containers(GROUP_ID)  # removed after its logs were kept
        assert (settings.data_dir / "runs" / record.id / "container.log").read_text()

        # The next turn's prompt contains the result.
        tg.push_message(GROUP_ID, f"@{tg.bot_username} what did it find?")
        await tg.wait_for_messages(GROUP_ID, 3, timeout_seconds=20)
        assert "[Subagent]: [Task: sleep 2 && echo crunched" in recorder.prompts[-1]
        assert "crunched 42" in recorder.prompts[-1]


async def test_cap_rejects_overflow_and_never_runs_more(tmp_path: Path, tg: FakeTelegram, subagent_image: str) -> None:
    settings = make_settings(
        tmp_path, tg, MAX_CONCURRENT_SUBAGENTS=3, MAX_SUBAGENTS_PER_CHAT=10, SUBAGENT_QUEUE_LIMIT=0
    )
    async with telegram_app(settings, with_subagents=True) as app:
        chat = await app.stores.chats.ensure(GROUP_ID, "supergroup", "cap test")
        ipc_root = settings.data_dir / "ipc"
        ensure_chat_dirs(ipc_root, chat.folder)
        tg.add_chat(GROUP_ID, title="cap test")
        batch = secrets.token_hex(3)
        requests = [SpawnRequest(request_id=f"cap-{batch}-{i:02d}", task="$ sleep 3", label=f"r{i}") for i in range(10)]
        most_running = 0
        stop_sampling = asyncio.Event()

        async def sample() -> None:
            nonlocal most_running
            while not stop_sampling.is_set():
                # Only this batch's containers: other tests may run containers for the same chat id.
                running = await asyncio.to_thread(
                    lambda: [
                        c
                        for c in labelled_containers(GROUP_ID)
                        if c.status == "running"
                        and (c.attrs.get("Labels") or {}).get(LABEL_RUN_ID, "").startswith(f"cap-{batch}-")
                    ]
                )
                most_running = max(most_running, len(running))
                await asyncio.sleep(0.1)

        sampler = asyncio.create_task(sample())
        for request in requests:  # all ten land at once
            write_spawn_request(ipc_root, chat.folder, request)
        records = await wait_for_runs(RunStore(app.stores.db), GROUP_ID, 10, final, RUN_WAIT_SECONDS)
        stop_sampling.set()
        await sampler

        statuses = sorted(r.status for r in records)
        assert statuses == ["completed"] * 3 + ["rejected"] * 7
        assert sorted(r.id for r in records) == sorted(r.request_id for r in requests)  # none lost, none twice
        assert 1 <= most_running <= 3
        assert list((ipc_root / chat.folder / "tasks").iterdir()) == []

        def told() -> tuple[list[str], list[str]] | None:
            texts = [m.plain_text for m in tg.sent_messages(GROUP_ID)]
            notices = [t for t in texts if "slots are busy" in t]
            results = [t for t in texts if t.startswith("Crew: [Task: r")]
            return (notices, results) if notices and len(results) >= 3 else None

        notices, results = await tg.wait_until(told)
        # The seven refusals arrived together: one notice tells them all, and the results are not held up.
        assert notices == [
            "Crew: All subagent slots are busy (3 running, limit 3): 7 tasks were not started. Please try again later."
        ]
        assert len(results) == 3


async def test_container_sandbox_holds_no_key_no_network_no_other_chat(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    key = "sk-test-SECRET-4b1d"
    checks = " ; ".join(
        [
            "echo net=$(ls /sys/class/net | tr '\\n' ,)",
            "echo uid=$(id -u)",
            "(touch /probe 2>/dev/null && echo rootfs=writable) || echo rootfs=readonly",
            "echo envkey=$(env | grep -c sk-test)",
            "echo filekey=$(grep -rIl sk-test / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | wc -l)",
            "echo other=$(find / -name other-chat-marker 2>/dev/null | wc -l)",
            "echo mine=$(cat /workspace/mine.txt)",
        ]
    )
    async with FakeLLM(api_key=key) as llm:
        llm.openai.enqueue(openai_tool_call("bash", {"command": checks}), openai_text("checked"))
        settings = make_settings(
            tmp_path,
            tg,
            LLM_PROVIDER="openai",
            LLM_BASE_URL=llm.base_url,
            LLM_API_KEY=key,
            LLM_MODEL="fake-model",
            ALLOWED_CHAT_IDS=f"{GROUP_ID},{GROUP_ID - 1}",
        )
        async with telegram_app(settings, model=FunctionModel(PromptRecorder()), with_subagents=True) as app:
            chat = await app.stores.chats.ensure(GROUP_ID, "supergroup", "sandbox")
            other = await app.stores.chats.ensure(GROUP_ID - 1, "supergroup", "other")
            workspaces = settings.data_dir / "workspaces"
            (workspaces / other.folder).mkdir(parents=True)
            (workspaces / other.folder / "other-chat-marker").write_text(key)
            (workspaces / chat.folder).mkdir(parents=True)
            (workspaces / chat.folder / "mine.txt").write_text("persisted")
            ipc_root = settings.data_dir / "ipc"
            ensure_chat_dirs(ipc_root, chat.folder)
            request = SpawnRequest(request_id=f"sandbox-{secrets.token_hex(4)}", task="check")
            write_spawn_request(ipc_root, chat.folder, request)
            (record,) = await wait_for_runs(RunStore(app.stores.db), GROUP_ID, 1, final, RUN_WAIT_SECONDS)
        assert record.status == "completed", record.error
        # The proxy added the key upstream; the container's view of its world came back as the tool result.
        requests = llm.requests("/v1/chat/completions")
        assert all(r.headers.get("authorization") == f"Bearer {key}" for r in requests)
        tool_output = str(requests[-1].body["messages"][-1]["content"])
        for fact in ("net=lo,", "uid=1000", "rootfs=readonly", "envkey=0", "filekey=0", "other=0", "mine=persisted"):
            assert fact in tool_output, tool_output


async def test_timeout_kills_and_records_timed_out(tmp_path: Path, tg: FakeTelegram, subagent_image: str) -> None:
    settings = make_settings(tmp_path, tg, SUBAGENT_TIMEOUT_SECONDS=3)
    async with telegram_app(settings, with_subagents=True) as app:
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ sleep 120")
        (record,) = await wait_for_runs(RunStore(app.stores.db), GROUP_ID, 1, final, RUN_WAIT_SECONDS)
        assert record.status == "timed_out"
        assert record.finished_at is not None and record.started_at is not None
        assert record.finished_at - record.started_at < 30
        told = await tg.wait_until(
            lambda: next((m for m in tg.sent_messages(GROUP_ID) if "Timed out" in m.plain_text), None)
        )
        assert "[Task: sleep 120]" in told.plain_text
        await until_no_containers(GROUP_ID)
