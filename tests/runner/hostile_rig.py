"""A running crewbot for hostile-subagent tests: real app, real SQLite, real engine and image, fakes at the edge.

The subagents' LLM is SubagentLLM (hostile_llm); attacks run as Python inside the container (hostile_scripts),
speaking raw HTTP to the run socket; the secret and the canaries beside DATA_DIR come from hostile_host_files.
Every check a hostile test owes (host files unchanged, no secret for the chat's next run, the bot answering
another chat, one outcome per run, budgets kept) is a method of `World`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from container.protocol import MAX_PROGRESS_CHARS, SpawnRequest
from core.settings import Settings
from core.store.chats import Chat
from core.store.messages import MessageStore
from core.store.runs import RunRecord, RunStatus, RunStore
from crewbot.app import App
from crewbot.serve import ObservedSubagents
from runner.channel.offline_subagent import message_text
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from runner.runs.outcome import MAX_RESULT_CHARS
from runner.service import SubagentService
from tests.fakes.llm_server import FakeLLM, RecordedRequest
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.hostile_host_files import (
    KEY_HALVES,
    LLM_KEY,
    SECRET,
    SECRET_HALVES,
    FileState,
    file_state,
    odd_host_entries,
    plant_canaries,
)
from tests.runner.hostile_llm import RUN_WAIT_SECONDS, SubagentLLM, last_task
from tests.runner.hostile_scripts import PROBE, container_python, reports

SUBAGENT_MODEL = "pinned-subagent-model"
MAX_MESSAGES = 3  # SUBAGENT_MAX_MESSAGES
MAX_TOKENS = 50_000  # SUBAGENT_MAX_TOKENS: room for a few of the agent's real calls (each holds its input first)
QUOTA_MB = 2  # WORKSPACE_QUOTA_MB
BYSTANDER = GROUP_ID - 900  # the chat that must keep getting answers
ANSWER_SECONDS = 15.0  # generous on purpose: it fails only if a hostile run blocks the bot
POLL_SECONDS = 0.1
TELEGRAM_PART_CHARS = 4_096
MAX_PARTS_PER_OUTCOME = -(-(MAX_RESULT_CHARS + 200) // TELEGRAM_PART_CHARS)  # a cut result and its heading


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


# --- the world --------------------------------------------------------------------------------------------


@dataclass
class World:
    settings: Settings
    tg: FakeTelegram
    llm: FakeLLM
    script: SubagentLLM
    app: App
    canaries: dict[Path, FileState]

    @property
    def service(self) -> SubagentService:
        assert isinstance(self.app.subagents, ObservedSubagents)
        return self.app.subagents.service

    @property
    def runs(self) -> RunStore:
        return RunStore(self.app.stores.db)

    @property
    def messages(self) -> MessageStore:
        return MessageStore(self.app.stores.db)

    @property
    def ipc_root(self) -> Path:
        return self.settings.data_dir / "ipc"

    def workspace(self, chat: Chat) -> Path:
        return self.settings.data_dir / "workspaces" / chat.folder

    async def chat(self, chat_id: int) -> Chat:
        chat = await self.app.stores.chats.ensure(chat_id, "supergroup", f"hostile {chat_id}")
        await asyncio.to_thread(ensure_chat_dirs, self.ipc_root, chat.folder)
        self.tg.add_chat(chat_id, title=f"hostile {chat_id}")
        return chat

    async def spawn(self, chat: Chat, task: str, label: str, *, run_id: str | None = None) -> str:
        """As the main agent would: a spawn request in the chat's IPC folder. Returns the run id."""
        run_id = run_id or new_id(label)
        request = SpawnRequest(request_id=run_id, task=task, label=label)
        await asyncio.to_thread(write_spawn_request, self.ipc_root, chat.folder, request)
        return run_id

    async def record(self, run_id: str) -> RunRecord | None:
        return await self.runs.get(run_id)

    async def wait_status(self, run_id: str, *statuses: str) -> RunRecord:
        async with asyncio.timeout(RUN_WAIT_SECONDS):
            while True:
                record = await self.runs.get(run_id)
                if record is not None and record.status in statuses:
                    return record
                await asyncio.sleep(POLL_SECONDS)

    async def wait_final(self, run_id: str) -> RunRecord:
        """The run's outcome, once the run is over on the host too: channel closed, container removed."""
        live = self.service.live
        async with asyncio.timeout(RUN_WAIT_SECONDS):
            while True:
                record = await self.runs.get(run_id)
                if (
                    record is not None
                    and record.status not in (RunStatus.QUEUED, RunStatus.RUNNING)
                    and run_id not in live
                ):
                    return record
                await asyncio.sleep(POLL_SECONDS)

    def calls_of(self, marker: str) -> list[RecordedRequest]:
        """The requests that reached FakeLLM for the run whose task holds `marker`."""
        return [r for r in self.llm.requests("/v1/chat/completions") if marker in last_task(r.body)]

    def tool_reports(self, marker: str) -> dict[str, Any]:
        """What the run's commands `report`ed, as the run's last LLM call carried it back (for a run whose
        result is something else: a result it posted itself, or none)."""
        calls = self.calls_of(marker)
        if not calls:
            return {}
        messages = calls[-1].body["messages"]
        task_index = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        return reports("\n".join(message_text(m) for m in messages[task_index:] if m.get("role") == "tool"))

    # --- the checks every attack owes ---------------------------------------------------------------------

    async def bystander_answers(self, *, while_running: str | None = None) -> None:
        """Another allowed chat's /help is answered now; with `while_running`, before that run has ended."""
        before = len(self.tg.sent_messages(BYSTANDER))
        self.tg.push_message(BYSTANDER, "/help")
        await self.tg.wait_for_messages(BYSTANDER, before + 1, timeout_seconds=ANSWER_SECONDS)
        if while_running is not None:
            record = await self.runs.get(while_running)
            assert record is not None and record.status == RunStatus.RUNNING, record

    async def assert_one_outcome(self, chat: Chat, record: RunRecord) -> str:
        """The run's outcome is one stored [Subagent] message, sent once; returns its stored text."""
        heading = f"[Task: {record.label}]\n"
        await self.tg.wait_until(
            lambda: next((m for m in self.tg.sent_messages(chat.id) if heading in m.plain_text), None),
            timeout_seconds=ANSWER_SECONDS,
        )
        stored = [m for m in await self.messages.recent(chat.id, 500) if m.kind == "subagent"]
        mine = [m for m in stored if m.content.startswith(heading)]
        assert len(mine) == 1, [m.content[:100] for m in mine]
        assert mine[0].sender_name == "[Subagent]" and mine[0].is_bot
        sent = [m for m in self.tg.sent_messages(chat.id) if m.plain_text.startswith(f"Crew: {heading}")]
        assert len(sent) == 1, [m.plain_text[:100] for m in sent]
        return mine[0].content

    async def assert_within_budgets(self, chat: Chat) -> None:
        """Every run of the chat kept SUBAGENT_MAX_MESSAGES, and the chat got no more than those messages and
        one (cut) outcome per run, each under Telegram's limit."""
        records = await self.runs.for_chat(chat.id, 100)
        assert all(r.messages_sent <= MAX_MESSAGES for r in records), [(r.id, r.messages_sent) for r in records]
        stored = await self.messages.recent(chat.id, 1_000)
        progress = [m for m in stored if m.kind == "progress"]
        assert len(progress) <= MAX_MESSAGES * len(records)
        sent = self.tg.sent_messages(chat.id)
        assert len(sent) <= len(records) * (MAX_MESSAGES + MAX_PARTS_PER_OUTCOME), len(sent)
        assert all(len(m.plain_text) <= TELEGRAM_PART_CHARS for m in sent)
        most_chars = len(records) * (MAX_MESSAGES * (MAX_PROGRESS_CHARS + 10) + MAX_RESULT_CHARS + 300)
        assert sum(len(m.plain_text) for m in sent) <= most_chars

    async def assert_no_secret_for_next_run(self, chat: Chat) -> None:
        """The chat's next run can find neither the operator's secret nor the provider key anywhere it looks."""
        marker = new_id("probe")
        task = f"{marker}\n{container_python(PROBE, halves=[SECRET_HALVES, KEY_HALVES])}"
        record = await self.wait_final(await self.spawn(chat, task, "probe"))
        assert record.status == "completed", record.error  # it started fine in the workspace the attack left
        found = reports(record.result)["probe"]
        assert found == {"file_hits": 0, "env_hits": 0, "task_status": 200, "task_hits": 0}, found
        outcome = await self.assert_one_outcome(chat, record)
        calls = self.calls_of(marker)
        assert calls, "the probe never reached the LLM"
        for text in (outcome, record.result or "", *(r.raw_body.decode() for r in calls)):
            assert SECRET not in text and LLM_KEY not in text

    def assert_host_untouched(self) -> None:
        for path, before in self.canaries.items():
            assert file_state(path) == before, f"{path} changed"
        odd = odd_host_entries(self.settings.data_dir)
        assert odd == [], odd


def hostile_settings(tmp_dir: Path, tg: FakeTelegram, llm: FakeLLM, chat_ids: list[int]) -> Settings:
    return make_settings(
        tmp_dir / "data",
        tg,
        ALLOWED_CHAT_IDS=",".join(str(c) for c in [*chat_ids, BYSTANDER]),
        LLM_PROVIDER="openai",
        LLM_BASE_URL=llm.base_url,
        LLM_API_KEY=LLM_KEY,
        LLM_MODEL="main-model",
        SUBAGENT_MODEL=SUBAGENT_MODEL,
        SUBAGENT_MAX_MESSAGES=MAX_MESSAGES,
        SUBAGENT_MAX_TOKENS=MAX_TOKENS,
        WORKSPACE_QUOTA_MB=QUOTA_MB,
        SUBAGENT_TIMEOUT_SECONDS=120,
        IPC_RESCAN_SECONDS=0.5,  # a stray spawn request anywhere the watcher looks would be found at once
        TYPING_INTERVAL_SECONDS=1.0,
    )


@asynccontextmanager
async def hostile_world(tmp_dir: Path, chat_ids: list[int]) -> AsyncIterator[World]:
    """One running bot for a module's attacks; each attack uses its own chat of `chat_ids`."""
    script = SubagentLLM()
    async with FakeTelegram() as tg, FakeLLM(api_key=LLM_KEY) as llm:
        llm.openai.handle_with(script)
        settings = hostile_settings(tmp_dir, tg, llm, chat_ids)
        canaries = plant_canaries(tmp_dir, settings.data_dir)
        async with telegram_app(settings, with_subagents=True) as app:
            world = World(settings, tg, llm, script, app, canaries)
            try:
                yield world
            finally:
                script.release_all()  # a failed test must not leave a run waiting for ever
        world.assert_host_untouched()
