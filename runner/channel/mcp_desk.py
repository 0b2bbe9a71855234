"""A run's MCP tools on the host: the operator's tools its task offered (`<server>__<tool>`), called here with
the server's credentials, for that run's chat, within the run's limits on calls and result bytes.

The container sends a name and arguments over its channel (POST /run/mcp); it never holds a token, a URL or
a connection. A name the task did not offer, a call past the run's limits, and any call once the run is
cancelled or finished are refused; a server that is down or slow fails only that call, as for the main agent.

A name the task did not offer is the container's own string: it is recorded as "-" (never a metric label, a row
or a log field of its choosing), counted toward the run's calls, and counted as an invalid request (the agent's
loop only calls what it was offered), so a run that keeps sending them is stopped. Refusals past the run's limits
count as invalid past PAST_LIMIT_GRACE of them. A call's result bytes are reserved before it is made, so calls in
flight together cannot overrun the run's limit; at most MAX_CONCURRENT_CALLS of a run's calls are in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from container.protocol import MAX_MCP_TOOLS, McpCall, ToolSpec
from core.logging import get_logger
from core.mcp_client import MAX_RESULT_CHARS, CallOutcome, CallStatus
from core.mcp_config import Use
from core.mcp_tool_list import OfferedTool
from runner.channel.channel_answers import ChannelRefused

log = get_logger(__name__)

TOO_MANY_STATUS = 429
NOT_OFFERED_STATUS = 404
UNKNOWN = "-"  # the server and tool recorded for a name no server offered
MAX_CONCURRENT_CALLS = 4  # of one run, in flight at once; more wait (a container holds a few connections)
PAST_LIMIT_GRACE = 8  # refusals a run may meet (a batch of calls at its limit) before each counts as invalid
# One call's result as the container gets it: MAX_RESULT_CHARS characters of up to 4 bytes, and a note.
MAX_RESULT_BYTES_PER_CALL = 4 * MAX_RESULT_CHARS + 1_000


class McpCaller(Protocol):
    """What the run needs of the operator's MCP servers (core/mcp_servers.py's McpServers)."""

    async def call(
        self,
        chat_id: int,
        use: Use,
        server_name: str,
        tool: str,
        arguments: dict[str, Any],
        max_chars: int = ...,
        run_id: str | None = ...,
        still_wanted: Callable[[], bool] | None = ...,
    ) -> CallOutcome: ...

    def record(self, chat_id: int, server: str, tool: str, outcome: CallOutcome, run_id: str | None = ...) -> None: ...


@dataclass(frozen=True, slots=True)
class McpLimits:
    max_calls: int
    max_result_bytes: int


@dataclass(slots=True)
class McpUse:
    """What a run has used: its calls and the bytes of the results it was given (its record, in its log line)."""

    calls: int = 0
    refused: int = 0
    result_bytes: int = 0


def offered_specs(tools: tuple[OfferedTool, ...], max_calls: int | None = None) -> list[ToolSpec]:
    """The task's `mcp_tools`: the first MAX_MCP_TOOLS that fit the contract's ToolSpec (the rest are logged);
    none when the run may make no call (SUBAGENT_MCP_MAX_CALLS=0): a tool offered could only be refused."""
    specs: list[ToolSpec] = []
    if max_calls == 0:
        return specs
    for tool in tools:
        if len(specs) >= MAX_MCP_TOOLS:
            log.warning("mcp_tools_left_out_of_run", offered=MAX_MCP_TOOLS, listed=len(tools))
            break
        try:
            specs.append(ToolSpec(name=tool.name, description=tool.description, parameters=tool.schema))
        except ValueError as exc:
            log.warning("mcp_tool_not_offered_to_run", tool=tool.name, reason=str(exc)[:200])
    return specs


class RunMcpDesk:
    def __init__(
        self,
        run_id: str,
        chat_id: int,
        servers: McpCaller,
        offered: Mapping[str, OfferedTool],
        limits: McpLimits,
        check_live: Callable[[], None],
        invalid: Callable[[int, str], None],
    ) -> None:
        self._run_id = run_id
        self._chat_id = chat_id
        self._servers = servers
        self._offered = dict(offered)
        self._limits = limits
        self._check_live = check_live  # raises ChannelRefused once the run is cancelled, finished or stopping
        self._invalid = invalid  # the run's count of invalid requests: it is stopped at a few
        self._calling = asyncio.Semaphore(MAX_CONCURRENT_CALLS)
        self._reserved = 0  # result bytes of the calls in flight, held against the run's limit
        self.used = McpUse()

    async def call(self, request: McpCall) -> str:
        self._check_live()
        tool = self._offered.get(request.tool)
        if tool is None:
            self.used.calls += 1
            reason = "that is not a tool offered to this run"
            self._refuse(None, reason)
            self._invalid(NOT_OFFERED_STATUS, reason)
            raise ChannelRefused(NOT_OFFERED_STATUS, reason)
        if self.used.calls >= self._limits.max_calls:
            self._refuse_past_limit(
                tool, f"this run has made its {self._limits.max_calls} MCP tool calls; finish without more"
            )
        left = self._limits.max_result_bytes - self.used.result_bytes - self._reserved
        if left <= 0:
            self._refuse_past_limit(
                tool, "this run has been given all the MCP tool results it may have; finish without more"
            )
        grant = min(left, MAX_RESULT_BYTES_PER_CALL)
        self.used.calls += 1
        self._reserved += grant
        try:
            async with self._calling:
                self._check_live()  # the wait for a turn may outlast the run
                outcome = await self._servers.call(
                    self._chat_id,
                    Use.SUBAGENTS,
                    tool.server,
                    tool.tool,
                    request.arguments,
                    min(MAX_RESULT_CHARS, grant),
                    run_id=self._run_id,
                    still_wanted=self._live,  # asked again right before the call is sent
                )
        finally:
            self._reserved -= grant
        self._check_live()  # a run that ended meanwhile is given nothing
        text = outcome.text.encode()[:grant].decode(errors="ignore")
        self.used.result_bytes += len(text.encode())
        log.info(
            "run_mcp_call",
            run_id=self._run_id,
            tool=tool.name,
            outcome=outcome.status.value,
            calls=self.used.calls,
            result_bytes=self.used.result_bytes,
        )
        return text

    def _live(self) -> bool:
        try:
            self._check_live()
        except ChannelRefused:
            return False
        return True

    def _refuse_past_limit(self, tool: OfferedTool, reason: str) -> None:
        self._refuse(tool, reason)
        if self.used.refused > PAST_LIMIT_GRACE:  # told to finish, and calling on: not the agent's loop
            self._invalid(TOO_MANY_STATUS, reason)
        raise ChannelRefused(TOO_MANY_STATUS, reason)

    def _refuse(self, tool: OfferedTool | None, reason: str) -> None:
        self.used.refused += 1
        server, called = (tool.server, tool.tool) if tool is not None else (UNKNOWN, UNKNOWN)
        outcome = CallOutcome(CallStatus.REFUSED, reason, 0, 0.0)
        self._servers.record(self._chat_id, server, called, outcome, run_id=self._run_id)
        log.warning("run_mcp_call_refused", run_id=self._run_id, tool=tool.name if tool else UNKNOWN, reason=reason)
