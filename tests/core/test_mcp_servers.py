"""The operator's MCP servers against real ones (tests/fakes/mcp_server.py over stdio and streamable HTTP): tools
listed, prefixed and checked, calls bounded, counted, and failing alone; the file read again when it changes."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from core.mcp_client import MAX_RESULT_CHARS, CallOutcome, CallStatus
from core.mcp_config import Use
from core.mcp_servers import McpServers
from core.mcp_tool_list import MAX_TOOLS_OFFERED
from core.store.chats import ChatStore
from core.store.db import Database
from tests.mcp_helpers import http_server, stdio_entry, write_config

CHAT = 42
# These tests wait for a server's list as long as it takes to start on a busy machine (a turn waits 3 s at most).
SLOW_START_SECONDS = 120.0


class Calls:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, CallStatus]] = []

    def __call__(self, server: str, tool: str, outcome: CallOutcome) -> None:
        self.seen.append((server, tool, outcome.status))


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[object]:
    opened: list[McpServers] = []

    def build(servers: dict[str, dict[str, object]], environ: dict[str, str] | None = None) -> McpServers:
        path = write_config(tmp_path / "mcp.json", servers)
        hub = McpServers(path, environ or {}, on_call=calls, list_wait_seconds=SLOW_START_SECONDS)
        opened.append(hub)
        return hub

    calls = Calls()
    build.calls = calls  # type: ignore[attr-defined]
    yield build
    for hub in opened:
        await hub.close()


async def test_stdio_tools_are_prefixed_and_called_with_the_env_secret(make) -> None:  # type: ignore[no-untyped-def]
    hub = make({"notes": stdio_entry(env={"DEMO_TOKEN": "${DEMO}"})}, {"DEMO": "s3cret-value"})
    tools = await hub.tools_for(CHAT, Use.MAIN)
    assert "notes__echo" in [t.name for t in tools.tools] and not tools.unavailable
    assert (await hub.call(CHAT, Use.MAIN, "notes", "echo", {"text": "hello"})).text == "hello"
    outcome = await hub.call(CHAT, Use.MAIN, "notes", "env_has", {"name": "DEMO_TOKEN"})
    assert outcome.text == "yes"
    assert make.calls.seen == [("notes", "echo", CallStatus.OK), ("notes", "env_has", CallStatus.OK)]


async def test_http_server_gets_its_headers(make) -> None:  # type: ignore[no-untyped-def]
    async with http_server() as url:
        hub = make({"web": {"url": url, "headers": {"X-Api-Key": "${KEY}"}}}, {"KEY": "k-123456"})
        names = [t.name for t in (await hub.tools_for(CHAT, Use.MAIN)).tools]
        assert "web__add" in names
        assert (await hub.call(CHAT, Use.MAIN, "web", "add", {"a": 2, "b": 3})).text == "5"
        assert (await hub.call(CHAT, Use.MAIN, "web", "header_has", {"name": "x-api-key"})).text == "yes"
        await hub.close()


async def test_the_allowlist_chats_and_use_decide(make) -> None:  # type: ignore[no-untyped-def]
    hub = make({"s": stdio_entry(tools=["echo"], chats=[CHAT])})
    assert [t.name for t in (await hub.tools_for(CHAT, Use.MAIN)).tools] == ["s__echo"]
    assert (await hub.tools_for(7, Use.MAIN)).tools == ()
    assert (await hub.tools_for(CHAT, Use.SUBAGENTS)).tools == ()
    for chat, use, tool in ((CHAT, Use.MAIN, "add"), (7, Use.MAIN, "echo"), (CHAT, Use.SUBAGENTS, "echo")):
        refused = await hub.call(chat, use, "s", tool, {"text": "x"})
        assert refused.status is CallStatus.REFUSED and "not available" in refused.text


async def test_a_slow_server_times_out_and_a_crash_fails_alone(make) -> None:  # type: ignore[no-untyped-def]
    hub = make({"s": stdio_entry(timeout_seconds=1)})
    slow = await hub.call(CHAT, Use.MAIN, "s", "slow", {"seconds": 30})
    assert slow.status is CallStatus.TIMEOUT and "did not answer within 1 s" in slow.text
    crash = await hub.call(CHAT, Use.MAIN, "s", "crash", {})
    assert crash.status is CallStatus.FAILED
    again = await hub.call(CHAT, Use.MAIN, "s", "echo", {"text": "back"})  # started again
    assert again.status is CallStatus.OK and again.text == "back"


async def test_a_server_that_never_starts_is_named_not_fatal(make) -> None:  # type: ignore[no-untyped-def]
    hub = make({"gone": {"command": "/nonexistent/server"}, "s": stdio_entry()})
    tools = await hub.tools_for(CHAT, Use.MAIN)
    assert [name for name, _ in tools.unavailable] == ["gone"]
    assert any(t.server == "s" for t in tools.tools)
    failed = await hub.call(CHAT, Use.MAIN, "gone", "x", {})
    assert failed.status is CallStatus.FAILED and "could not be called" in failed.text


async def test_a_long_result_is_cut_with_a_note(make) -> None:  # type: ignore[no-untyped-def]
    hub = make({"s": stdio_entry()})
    outcome = await hub.call(CHAT, Use.MAIN, "s", "big", {"n": 200_000})
    assert outcome.status is CallStatus.OK and outcome.result_chars == 200_000
    assert len(outcome.text) < MAX_RESULT_CHARS + 200 and "[cut: the result had 200000 characters" in outcome.text


async def test_a_50_mb_answer_ends_bounded_and_the_server_is_usable_after(make) -> None:  # type: ignore[no-untyped-def]
    hub = make({"s": stdio_entry(timeout_seconds=60)})
    outcome = await hub.call(CHAT, Use.MAIN, "s", "big", {"n": 50 * 1024 * 1024})
    # Never read whole: the transport gives up at MAX_MESSAGE_BYTES and says so (else timed out on a slow machine).
    assert outcome.status in (CallStatus.FAILED, CallStatus.TIMEOUT) and len(outcome.text) < MAX_RESULT_CHARS + 200
    assert outcome.status is CallStatus.TIMEOUT or "over 4 MiB" in outcome.text
    assert (await hub.call(CHAT, Use.MAIN, "s", "echo", {"text": "still here"})).text == "still here"


async def test_junk_on_stdout_bad_schemas_collisions_and_2500_tools(make) -> None:  # type: ignore[no-untyped-def]
    # 2,500 tools (more than MAX_TOOLS_LISTED) in one page: the test server takes a while to register 10,000.
    hub = make({"s": stdio_entry("--junk", "--bad-schema", "--collide", "--many", "2500", timeout_seconds=120)})
    tools = (await hub.tools_for(CHAT, Use.MAIN)).tools
    names = [t.name for t in tools]
    assert len(tools) == MAX_TOOLS_OFFERED
    assert "s__broken" not in names  # its schema is not JSON Schema
    assert all(name.startswith("s__") for name in names)  # never `spawn_subagent` itself
    assert (await hub.call(CHAT, Use.MAIN, "s", "echo", {"text": "ok"})).text == "ok"


async def test_the_colliding_names_stay_apart(make) -> None:  # type: ignore[no-untyped-def]
    hub = make({"s": stdio_entry("--collide")})
    names = {t.name for t in (await hub.tools_for(CHAT, Use.MAIN)).tools}
    assert {"s__spawn_subagent", "s__subagents", "s__schedule_task"} <= names


async def test_a_redirect_is_never_followed(make) -> None:  # type: ignore[no-untyped-def]
    hits: list[str] = []
    location = [""]

    async def target(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="{}")

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(location[0])

    other = web.Application()
    other.router.add_route("*", "/{tail:.*}", target)
    first = web.Application()
    first.router.add_route("*", "/{tail:.*}", redirect)
    runners = [web.AppRunner(app) for app in (other, first)]
    for runner in runners:
        await runner.setup()
    sites = [web.TCPSite(runner, "127.0.0.1", 0) for runner in runners]
    for site in sites:
        await site.start()
    other_port = sites[0]._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    first_port = sites[1]._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        for to in (f"http://127.0.0.1:{other_port}/mcp", "http://169.254.169.254/latest/meta-data/"):
            location[0] = to
            hub = make(
                {"r": {"url": f"http://127.0.0.1:{first_port}/mcp", "headers": {"Authorization": "${T}"}}},
                {"T": "Bearer hunter2-secret"},
            )
            tools = await hub.tools_for(CHAT, Use.MAIN)
            assert tools.tools == () and tools.unavailable[0][0] == "r"
            assert "hunter2" not in tools.unavailable[0][1]
            await hub.close()
        assert hits == []
    finally:
        for runner in runners:
            await runner.cleanup()


async def test_the_file_is_read_again_when_it_changes(make, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hub = make({"a": stdio_entry(tools=["echo"])})
    assert [t.name for t in (await hub.tools_for(CHAT, Use.MAIN)).tools] == ["a__echo"]
    write_config(tmp_path / "mcp.json", {"b": stdio_entry(tools=["add"])})
    assert [t.name for t in (await hub.tools_for(CHAT, Use.MAIN)).tools] == ["b__add"]
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"c": {"command": "x", "args": ["--token=abc"]}}}))
    assert [t.name for t in (await hub.tools_for(CHAT, Use.MAIN)).tools] == ["b__add"]  # the last valid one stays
    assert hub.problem is not None and "passes a secret" in hub.problem
    await asyncio.sleep(0)


async def test_a_server_that_never_answers_costs_a_turn_a_bounded_wait(tmp_path: Path) -> None:
    hang = {"command": sys.executable, "args": ["-c", "import time; time.sleep(600)"]}
    hub = McpServers(write_config(tmp_path / "mcp.json", {"hang": hang}), {}, list_wait_seconds=0.5)
    try:
        for _ in range(3):  # each turn: back before the start's 30 s bound, the server named as starting
            tools = await hub.tools_for(CHAT, Use.MAIN)
            assert tools.unavailable == (("hang", "it is starting; its tools are offered once it answers"),)
    finally:
        await hub.close()


async def test_a_failed_server_is_not_tried_again_at_every_turn(tmp_path: Path) -> None:
    hub = McpServers(write_config(tmp_path / "mcp.json", {"gone": {"command": "/nonexistent/server"}}), {})
    try:
        with capture_logs() as logs:
            for _ in range(5):
                tools = await hub.tools_for(CHAT, Use.MAIN)
                assert [name for name, _ in tools.unavailable] == ["gone"]
        assert [entry["event"] for entry in logs].count("mcp_server_unavailable") == 1  # then backed off
    finally:
        await hub.close()


async def test_a_deleted_missing_or_emptied_file_means_no_servers(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    hub = McpServers(path, {}, list_wait_seconds=SLOW_START_SECONDS)
    try:
        assert (await hub.tools_for(CHAT, Use.MAIN)).tools == ()
        assert hub.problem is not None and "does not exist" in hub.problem  # reported at start-up
        write_config(path, {"a": stdio_entry(tools=["echo"])})
        assert [t.name for t in (await hub.tools_for(CHAT, Use.MAIN)).tools] == ["a__echo"] and hub.problem is None
        path.unlink()
        assert (await hub.tools_for(CHAT, Use.MAIN)).tools == ()
        assert (await hub.call(CHAT, Use.MAIN, "a", "echo", {"text": "x"})).status is CallStatus.REFUSED
        write_config(path, {"a": stdio_entry(tools=["echo"])})
        assert (await hub.tools_for(CHAT, Use.MAIN)).tools != ()
        path.write_text("")
        assert (await hub.tools_for(CHAT, Use.MAIN)).tools == () and hub.problem is None
    finally:
        await hub.close()


async def test_chats_names_the_platform_chat_so_its_forum_topics_match(tmp_path: Path, db: Database) -> None:
    chats = ChatStore(db)
    group = -1001234567890
    topic = await chats.resolve(group, 17, "supergroup", "forum")
    assert topic != group

    async def platform_of(chat_id: int) -> int:
        return (await chats.address(chat_id)).platform_chat_id

    path = write_config(tmp_path / "mcp.json", {"s": stdio_entry(tools=["echo"], chats=[group])})
    hub = McpServers(path, {}, platform_of=platform_of, list_wait_seconds=SLOW_START_SECONDS)
    try:
        assert [t.name for t in (await hub.tools_for(topic, Use.MAIN)).tools] == ["s__echo"]
        assert (await hub.call(topic, Use.MAIN, "s", "echo", {"text": "hi"})).text == "hi"
        assert (await hub.tools_for(-100999, Use.MAIN)).tools == ()
    finally:
        await hub.close()
