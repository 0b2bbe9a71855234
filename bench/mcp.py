"""An MCP tool call through crewbot against the same call made directly with the MCP client, in the same run.

A real stdio server (tests/fakes/mcp_server.py, the `mcp` package's server API), its `echo` tool with a short
text. Arms, interleaved round by round (their order alternating):
- direct: `ClientSession.call_tool` on a session held open, as any MCP client makes it (the baseline);
- main agent: the tool function the main agent's toolset calls (bot/agent/mcp_tools.py): the config checked
  for a change (a stat in a thread), the call bounded, logged, counted, its result marked untrusted;
- subagent: the container's `RunChannel.mcp_call` over a run socket to the host's real LLM proxy and run API,
  a run's MCP desk (its limits and live check) and the same call (the channel round trip a subagent pays).
Goals (issue 40): main agent at most 1.2x the direct call, a subagent's round trip at most 2x.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from bench.common import BenchContext, ms
from bench.report import Measure, Row
from container.channel import RunChannel
from container.protocol import McpCall
from core.mcp_config import Use
from core.mcp_servers import McpServers
from runner.channel.mcp_desk import McpLimits, RunMcpDesk
from tests.mcp_helpers import REPO_ROOT, SERVER_MODULE, stdio_entry, write_config
from tests.runner.channel.run_api_server import Recorder, serve

NAME = "mcp"
CHAT = 1
WARMUP_ROUNDS = 20
ARGUMENTS = {"text": "hello"}


class DeskEndpoint(Recorder):
    """The run API's endpoint with a real MCP desk behind POST /run/mcp."""

    desk: RunMcpDesk | None = None

    async def mcp_call(self, call: McpCall) -> str:
        assert self.desk is not None
        return await self.desk.call(call)


async def run(ctx: BenchContext) -> list[Row]:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from bot.agent.mcp_tools import turn_toolset

    rounds = ctx.scaled(300, 60)
    logging.getLogger("mcp").setLevel(logging.WARNING)
    path = write_config(ctx.work_dir / "mcp.json", {"notes": stdio_entry(tools=["echo"], use=["main", "subagents"])})
    servers = McpServers(path, {}, list_wait_seconds=120)
    params = StdioServerParameters(command=sys.executable, args=["-m", SERVER_MODULE], cwd=str(REPO_ROOT))
    times: dict[str, list[float]] = {"direct": [], "main": [], "subagent": []}
    try:
        toolset = await turn_toolset(servers, CHAT)
        assert toolset is not None
        main_tool = cast(Callable[..., Awaitable[str]], toolset.tools["notes__echo"].function)
        offered = {t.name: t for t in (await servers.tools_for(CHAT, Use.SUBAGENTS)).tools}
        endpoint = DeskEndpoint()
        limits = McpLimits(10**6, 10**9)
        endpoint.desk = RunMcpDesk("bench-run", CHAT, servers, offered, limits, lambda: None, _no_invalid)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()

            async def timed_rounds(sock: Path) -> None:
                channel = RunChannel(sock)

                async def direct() -> Any:
                    return await session.call_tool("echo", ARGUMENTS)

                async def main() -> Any:
                    return await main_tool(**ARGUMENTS)

                async def subagent() -> Any:
                    return await channel.mcp_call("notes__echo", ARGUMENTS)

                arms = {"direct": direct, "main": main, "subagent": subagent}
                for index in range(WARMUP_ROUNDS + rounds):
                    for key in list(arms) if index % 2 == 0 else list(reversed(arms)):
                        started = time.perf_counter()
                        result = await arms[key]()
                        took = ms(time.perf_counter() - started)
                        if index >= WARMUP_ROUNDS:
                            times[key].append(took)
                        if index == 0:
                            ctx.note(f"{key}: {str(result)[:80]!r}")

            await serve(endpoint, timed_rounds)
    finally:
        with contextlib.suppress(Exception):
            await servers.close()
    measure = {key: Measure.of(samples) for key, samples in times.items()}
    ctx.note(f"{rounds} rounds after {WARMUP_ROUNDS} warm-up, the arms alternating which goes first")
    return [
        Row(
            NAME,
            "an MCP tool call made directly with the MCP client (stdio, session held open)",
            "ms",
            measure["direct"],
        ),
        Row(
            NAME,
            "the same call through the main agent's MCP tool (goal: at most 1.2x)",
            "ms",
            measure["main"],
            baseline_label="direct call",
            baseline=measure["direct"],
        ),
        Row(
            NAME,
            "the same call from a subagent over its run channel, made by the host (goal: at most 2x)",
            "ms",
            measure["subagent"],
            baseline_label="direct call",
            baseline=measure["direct"],
        ),
    ]


def _no_invalid(status: int, reason: str) -> None:
    """The bench's run sends only offered tools: nothing is counted as invalid."""
