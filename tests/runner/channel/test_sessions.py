"""A chat's subagents share a session: the second one starts from the first one's history."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from container.protocol import SpawnRequest
from core.store.messages import MessageStore
from core.store.runs import RunStore
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from tests.fakes.llm_server import FakeLLM, openai_text, openai_tool_call
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS, final, wait_for_runs

pytestmark = pytest.mark.docker

CHAT = GROUP_ID - 300


def conversation(body: dict[str, Any]) -> str:
    return json.dumps(body["messages"])


class Subagents:
    """Scripted subagent LLM: the first task sends a progress message then notes a number; the second
    answers from what it can see of the first."""

    def __init__(self) -> None:
        self.second_request: dict[str, Any] | None = None

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        last = messages[-1]
        if last["role"] == "tool":
            return openai_text("Noted the number 7.")
        task = str(last["content"])
        if "Remember the number" in task:
            return openai_tool_call("send_message", {"text": "working on it"})
        self.second_request = body
        seen = "7" if "Noted the number 7." in conversation(body) else "nothing"
        return openai_text(f"The first run noted {seen}.")


async def test_second_subagent_continues_the_first_ones_session(tmp_path: Path) -> None:
    script = Subagents()
    async with FakeTelegram() as tg, FakeLLM(api_key="sk-test-session") as llm:
        llm.openai.handle_with(script)
        tg.add_chat(CHAT, title="sessions")
        settings = make_settings(
            tmp_path,
            tg,
            ALLOWED_CHAT_IDS=str(CHAT),
            LLM_PROVIDER="openai",
            LLM_BASE_URL=llm.base_url,
            LLM_API_KEY="sk-test-session",
            LLM_MODEL="fake-model",
        )
        async with telegram_app(settings, with_subagents=True) as app:
            tg.push_message(CHAT, "context line: the deploy is on Friday", first_name="Dee")
            store = MessageStore(app.stores.db)
            chat = await app.stores.chats.ensure(CHAT, "supergroup", "sessions")
            ipc_root = settings.data_dir / "ipc"
            ensure_chat_dirs(ipc_root, chat.folder)
            runs = RunStore(app.stores.db)

            first = SpawnRequest(request_id=f"s1-{secrets.token_hex(4)}", task="Remember the number 7.", label="one")
            write_spawn_request(ipc_root, chat.folder, first)
            await wait_for_runs(runs, CHAT, 1, final, RUN_WAIT_SECONDS)
            second = SpawnRequest(
                request_id=f"s2-{secrets.token_hex(4)}",
                task="What number did you note?",
                label="two",
                include_context=True,
            )
            write_spawn_request(ipc_root, chat.folder, second)
            records = await wait_for_runs(runs, CHAT, 2, final, RUN_WAIT_SECONDS)

            by_id = {r.id: r for r in records}
            assert by_id[first.request_id].status == "completed"
            assert by_id[second.request_id].status == "completed"
            assert by_id[second.request_id].session_in == by_id[first.request_id].session_out == first.request_id
            assert await runs.current_session(CHAT) == second.request_id
            assert script.second_request is not None
            assert "Remember the number 7." in conversation(script.second_request)
            assert "the deploy is on Friday" in conversation(script.second_request)  # include_context

            # A run is recorded final before the outbox has sent its result: wait for the result to reach the chat.
            await tg.wait_until(lambda: _sent_starting(tg, "Crew: [Task: two]\nThe first run noted 7.") or None)
            texts = [m.plain_text for m in tg.sent_messages(CHAT)]
            assert "Crew: working on it" in texts  # the progress message reached the chat
            stored = await store.recent(CHAT, 20)
            assert [m.sender_name for m in stored if m.kind == "progress"] == ["[Subagent]"]


def _sent_starting(tg: FakeTelegram, prefix: str) -> bool:
    return any(m.plain_text.startswith(prefix) for m in tg.sent_messages(CHAT))
