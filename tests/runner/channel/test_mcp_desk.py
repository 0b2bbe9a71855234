"""A run's MCP tools on the host (a real stdio server, tests/fakes/mcp_server.py): only the offered tools, only
while the run is live, within its limits on calls and result bytes; the task carries names and schemas, never
the server's command, URL, environment or headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.protocol import McpCall, TaskSpec
from core.mcp_client import CallOutcome, CallStatus
from core.mcp_config import Use
from core.mcp_servers import McpServers
from core.store.db import Database
from core.store.mcp_calls import McpCallStore
from runner.channel.channel_answers import ChannelRefused
from runner.channel.mcp_desk import PAST_LIMIT_GRACE, McpLimits, RunMcpDesk, offered_specs
from tests.mcp_helpers import stdio_entry, write_config

CHAT = 42
SECRET = "sub-secret-token-5678"


class Live:
    """The run's side the desk reports to: its liveness, and its count of invalid requests."""

    def __init__(self) -> None:
        self.ended = False
        self.invalid: list[int] = []

    def check(self) -> None:
        if self.ended:
            raise ChannelRefused(403, "run r1 is cancelled or finished")

    def count_invalid(self, status: int, reason: str) -> None:
        self.invalid.append(status)


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[tuple[McpServers, list[tuple[str, str, CallStatus]]]]:
    counted: list[tuple[str, str, CallStatus]] = []

    def count(server: str, tool: str, outcome: CallOutcome) -> None:
        counted.append((server, tool, outcome.status))

    path = write_config(
        tmp_path / "mcp.json",
        {
            "notes": stdio_entry(tools=["echo", "big"], use=["main", "subagents"], env={"NOTES_TOKEN": "${S}"}),
            "private": stdio_entry(tools=["add"]),  # the main agent's only
        },
    )
    servers = McpServers(path, {"S": SECRET}, on_call=count, list_wait_seconds=120)
    yield servers, counted
    await servers.close()


async def desk_for(servers: McpServers, live: Live, max_calls: int = 5, max_bytes: int = 100_000) -> RunMcpDesk:
    offered = (await servers.tools_for(CHAT, Use.SUBAGENTS)).tools
    limits = McpLimits(max_calls, max_bytes)
    return RunMcpDesk("r1", CHAT, servers, {t.name: t for t in offered}, limits, live.check, live.count_invalid)


async def test_the_task_names_only_the_subagents_tools_and_holds_no_credential(hub) -> None:  # type: ignore[no-untyped-def]
    servers, _ = hub
    specs = offered_specs((await servers.tools_for(CHAT, Use.SUBAGENTS)).tools)
    assert sorted(s.name for s in specs) == ["notes__big", "notes__echo"]
    task = TaskSpec(run_id="run-abcdef", task="t", label="l", mcp_tools=specs).model_dump_json()
    for hidden in (SECRET, "NOTES_TOKEN", "mcp_server", "private__"):
        assert hidden not in task


async def test_a_run_that_may_make_no_call_is_offered_no_tool(hub) -> None:  # type: ignore[no-untyped-def]
    servers, _ = hub
    tools = (await servers.tools_for(CHAT, Use.SUBAGENTS)).tools
    assert tools and offered_specs(tools, max_calls=0) == [] and len(offered_specs(tools, max_calls=1)) == 2


async def test_an_offered_tool_is_called_by_the_host_and_counted(hub) -> None:  # type: ignore[no-untyped-def]
    servers, counted = hub
    desk = await desk_for(servers, Live())
    assert await desk.call(McpCall(tool="notes__echo", arguments={"text": "hi"})) == "hi"
    assert desk.used.calls == 1 and desk.used.result_bytes == 2
    assert counted == [("notes", "echo", CallStatus.OK)]


async def test_a_tool_not_offered_to_subagents_is_refused(hub) -> None:  # type: ignore[no-untyped-def]
    servers, counted = hub
    live = Live()
    desk = await desk_for(servers, live)
    for name in ("private__add", "notes__add", "spawn_subagent"):
        with pytest.raises(ChannelRefused) as caught:
            await desk.call(McpCall(tool=name, arguments={"a": 1, "b": 2}))
        assert caught.value.status == 404
    # Never the container's string: recorded as "-"; each counts toward the run's calls and as invalid.
    assert counted == [("-", "-", CallStatus.REFUSED)] * 3
    assert desk.used.calls == 3 and live.invalid == [404] * 3


async def test_random_unoffered_names_make_no_new_series_or_rows(tmp_path: Path, db: Database) -> None:
    from runner.lifecycle.metrics import RunMetrics

    metrics = RunMetrics()
    path = write_config(tmp_path / "m.json", {"notes": stdio_entry(tools=["echo"], use=["subagents"])})
    servers = McpServers(path, {}, on_call=metrics.count_mcp_call, store=McpCallStore(db), list_wait_seconds=120)
    live = Live()
    try:
        desk = await desk_for(servers, live, max_calls=1_000)
        for index in range(200):
            with pytest.raises(ChannelRefused):
                await desk.call(McpCall(tool=f"x{index:040x}", arguments={}))
    finally:
        await servers.close()  # the rows are written first
    series = {
        sample.labels["tool"]
        for family in metrics.registry.collect()
        if family.name == "crewbot_mcp_tool_calls"
        for sample in family.samples
    }
    assert series == {"-"}
    assert {row.tool for row in await McpCallStore(db).since(0.0)} == {"-"}
    assert len(live.invalid) == 200  # the run's endpoint stops it at its third (run_endpoint.MAX_INVALID_REQUESTS)


async def test_calls_past_the_runs_limit_are_refused(hub) -> None:  # type: ignore[no-untyped-def]
    servers, _ = hub
    live = Live()
    desk = await desk_for(servers, live, max_calls=3)
    for _ in range(3):
        await desk.call(McpCall(tool="notes__echo", arguments={"text": "x"}))
    for _ in range(PAST_LIMIT_GRACE + 2):  # a run that keeps calling is told no, without reaching the server
        with pytest.raises(ChannelRefused) as caught:
            await desk.call(McpCall(tool="notes__echo", arguments={"text": "x"}))
        assert caught.value.status == 429
    assert desk.used.calls == 3 and desk.used.refused == PAST_LIMIT_GRACE + 2
    assert live.invalid == [429, 429]  # past the grace, each counts: the run is stopped soon


async def test_result_bytes_are_bounded_per_run(hub) -> None:  # type: ignore[no-untyped-def]
    servers, _ = hub
    desk = await desk_for(servers, Live(), max_bytes=1_500)
    first = await desk.call(McpCall(tool="notes__big", arguments={"n": 1_000}))
    second = await desk.call(McpCall(tool="notes__big", arguments={"n": 1_000}))
    assert len(first) == 1_000 and len(second.encode()) <= 500
    with pytest.raises(ChannelRefused, match="all the MCP tool results"):
        await desk.call(McpCall(tool="notes__big", arguments={"n": 10}))


async def test_concurrent_calls_never_overrun_the_result_bytes(hub) -> None:  # type: ignore[no-untyped-def]
    servers, _ = hub
    desk = await desk_for(servers, Live(), max_calls=100, max_bytes=20_000)

    async def one() -> int:
        try:
            return len((await desk.call(McpCall(tool="notes__big", arguments={"n": 15_000}))).encode())
        except ChannelRefused:
            return 0

    given = await asyncio.gather(*(one() for _ in range(16)))
    assert sum(given) <= 20_000 and desk.used.result_bytes <= 20_000


async def test_a_run_that_ends_while_its_server_starts_makes_no_call(hub) -> None:  # type: ignore[no-untyped-def]
    servers, counted = hub
    live = Live()
    desk = await desk_for(servers, live)
    await servers.close()  # the server is down: the next call starts it, which takes a while
    call = asyncio.create_task(desk.call(McpCall(tool="notes__echo", arguments={"text": "late"})))
    await asyncio.sleep(0.2)
    live.ended = True
    with pytest.raises(ChannelRefused, match="cancelled or finished"):
        await call
    assert counted[-1] == ("notes", "echo", CallStatus.REFUSED)  # asked again right before the call: not made


async def test_a_cancelled_call_is_recorded(hub) -> None:  # type: ignore[no-untyped-def]
    servers, counted = hub
    desk = await desk_for(servers, Live())
    await desk.call(McpCall(tool="notes__echo", arguments={"text": "warm"}))
    call = asyncio.create_task(desk.call(McpCall(tool="notes__big", arguments={"n": 10})))
    await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert counted[-1] == ("notes", "big", CallStatus.CANCELLED)


async def test_refused_once_the_run_has_ended(hub) -> None:  # type: ignore[no-untyped-def]
    servers, counted = hub
    live = Live()
    desk = await desk_for(servers, live)
    live.ended = True
    with pytest.raises(ChannelRefused, match="cancelled or finished"):
        await desk.call(McpCall(tool="notes__echo", arguments={"text": "late"}))
    assert counted == []


async def test_a_runs_calls_are_in_its_records(tmp_path: Path, db: Database) -> None:
    path = write_config(tmp_path / "runs.json", {"notes": stdio_entry(tools=["echo"], use=["subagents"])})
    servers = McpServers(path, {}, store=McpCallStore(db), list_wait_seconds=120)
    try:
        desk = await desk_for(servers, Live(), max_calls=1)
        await desk.call(McpCall(tool="notes__echo", arguments={"text": "x"}))
        with pytest.raises(ChannelRefused):
            await desk.call(McpCall(tool="notes__echo", arguments={"text": "y"}))
    finally:
        await servers.close()
    rows = await McpCallStore(db).since(0.0)
    assert [(r.run_id, r.tool, r.outcome) for r in rows] == [("r1", "echo", "ok"), ("r1", "echo", "refused")]
