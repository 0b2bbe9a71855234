"""Subagents use the operator's MCP tools for real: the real image and engine, fake Telegram, real PTB, SQLite,
a fake LLM behind the proxy, and a real stdio MCP server started by the host with a token in its environment.

The container sees `notes__env_has` as a tool of its own and calls it over its channel; the host makes the call
(the server has the token: "yes"); a tool not offered to subagents is unknown to the agent and refused by the
host when the run asks for it on the socket itself; and the container's own view
of its world (environment, every file it can read) holds no trace of the token or the server's command."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from pydantic_ai.models.function import FunctionModel

from container.protocol import SpawnRequest
from core.mcp_servers import McpServers
from core.store.runs import RunStore
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from tests.fakes.llm_server import FakeLLM, openai_text, openai_tool_call
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.mcp_helpers import stdio_entry, write_config
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS, PromptRecorder, final, tg, wait_for_runs

pytestmark = pytest.mark.docker

# A hostile run skipping its agent: a call of a tool its task did not offer, straight on the run socket.
DIRECT_CALL = ";".join(
    [
        "import socket, json",
        "s = socket.socket(socket.AF_UNIX)",
        's.connect("/crewbot/channel/run.sock")',
        'b = json.dumps({"tool": "mainonly__add", "arguments": {"a": 1, "b": 2}}).encode()',
        "e = chr(13) + chr(10)",
        'h = e.join(["POST /run/mcp HTTP/1.1", "Host: run", "Content-Type: application/json",'
        ' "Content-Length: " + str(len(b)), "Connection: close", "", ""]).encode()',
        "s.sendall(h + b)",
        'print("direct=" + s.recv(65536).decode().split(e)[0])',
    ]
)

__all__ = ["tg"]  # the fixture


async def test_a_subagent_calls_an_mcp_tool_through_the_host_and_never_holds_its_token(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    token = f"mcp-e2e-{secrets.token_hex(8)}"
    path = write_config(
        tmp_path / "mcp.json",
        {
            "notes": stdio_entry(tools=["env_has", "echo"], use=["subagents"], env={"NOTES_TOKEN": "${E2E_TOKEN}"}),
            "mainonly": stdio_entry(tools=["add"]),
        },
    )
    looks = "; ".join(
        [
            f"echo envtoken=$(env | grep -c {token})",
            f"echo filetoken=$(grep -rIl {token} / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | wc -l)",
            "echo serverfiles=$(grep -rIl mcp_server /crewbot /workspace /tmp 2>/dev/null | wc -l)",
            f"python3 -c '{DIRECT_CALL}'",
        ]
    )
    async with FakeLLM() as llm:
        llm.openai.enqueue(
            openai_tool_call("notes__env_has", {"name": "NOTES_TOKEN"}),
            openai_tool_call("mainonly__add", {"a": 1, "b": 2}),
            openai_tool_call("bash", {"command": looks}),
            openai_text("done"),
        )
        settings = make_settings(
            tmp_path, tg, LLM_PROVIDER="openai", LLM_BASE_URL=llm.base_url, LLM_API_KEY="k", LLM_MODEL="fake-model"
        )
        servers = McpServers(path, {"E2E_TOKEN": token}, list_wait_seconds=120)
        async with telegram_app(
            settings, model=FunctionModel(PromptRecorder()), with_subagents=True, mcp=servers
        ) as app:
            chat = await app.stores.chats.ensure(GROUP_ID, "supergroup", "mcp")
            ipc_root = settings.data_dir / "ipc"
            ensure_chat_dirs(ipc_root, chat.folder)
            write_spawn_request(ipc_root, chat.folder, SpawnRequest(request_id=f"mcp-{secrets.token_hex(4)}", task="t"))
            (record,) = await wait_for_runs(RunStore(app.stores.db), GROUP_ID, 1, final, RUN_WAIT_SECONDS)
        assert record.status == "completed", record.error
    requests = [r.body for r in llm.requests("/v1/chat/completions")]
    offered = {tool["function"]["name"] for tool in requests[0]["tools"]}
    assert "notes__env_has" in offered and "notes__echo" in offered
    assert not any(name.startswith("mainonly__") for name in offered)
    results = [str(m["content"]) for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert results[0] == "yes"  # the host's server had the token
    assert "unknown tool 'mainonly__add'" in results[1]  # the model is never offered it
    for fact in ("envtoken=0", "filetoken=0", "serverfiles=0", "direct=HTTP/1.1 404"):
        assert fact in results[2], results[2]
    assert token not in json.dumps(results)  # the commands name it (to look for it); no result holds it
