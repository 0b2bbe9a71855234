"""A run's MCP tools on the host: the operator's tools its task offered (`<server>__<tool>`), called here with
the server's credentials, for that run's chat, within the run's limits on calls and result bytes.

The container sends a name and arguments over its channel (POST /run/mcp); it never holds a token, a URL or
a connection. A name the task did not offer, a call past the run's limits, and any call once the run is
cancelled or finished are refused; a server that is down or slow fails only that call, as for the main agent.
"""

from __future__ import annotations

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


def offered_specs(tools: tuple[OfferedTool, ...]) -> list[ToolSpec]:
    """The task's `mcp_tools`: the first MAX_MCP_TOOLS that fit the contract's ToolSpec (the rest are logged)."""
    specs: list[ToolSpec] = []
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
    ) -> None:
        self._run_id = run_id
        self._chat_id = chat_id
        self._servers = servers
        self._offered = dict(offered)
        self._limits = limits
        self._check_live = check_live  # raises ChannelRefused once the run is cancelled, finished or stopping
        self.used = McpUse()

    async def call(self, request: McpCall) -> str:
        self._check_live()
        tool = self._offered.get(request.tool)
        if tool is None:
            self._refuse(request.tool, f"{request.tool} is not a tool offered to this run")
            raise ChannelRefused(NOT_OFFERED_STATUS, f"{request.tool} is not a tool offered to this run")
        if self.used.calls >= self._limits.max_calls:
            reason = f"this run has made its {self._limits.max_calls} MCP tool calls; finish without more"
            self._refuse(request.tool, reason, tool)
            raise ChannelRefused(TOO_MANY_STATUS, reason)
        left = self._limits.max_result_bytes - self.used.result_bytes
        if left <= 0:
            reason = "this run has been given all the MCP tool results it may have; finish without more"
            self._refuse(request.tool, reason, tool)
            raise ChannelRefused(TOO_MANY_STATUS, reason)
        self.used.calls += 1
        outcome = await self._servers.call(
            self._chat_id,
            Use.SUBAGENTS,
            tool.server,
            tool.tool,
            request.arguments,
            min(MAX_RESULT_CHARS, left),
            run_id=self._run_id,
        )
        self._check_live()  # a run that ended meanwhile is given nothing
        text = outcome.text.encode()[:left].decode(errors="ignore")
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

    def _refuse(self, name: str, reason: str, tool: OfferedTool | None = None) -> None:
        self.used.refused += 1
        server, called = (tool.server, tool.tool) if tool is not None else ("-", name[:64])
        outcome = CallOutcome(CallStatus.REFUSED, reason, 0, 0.0)
        self._servers.record(self._chat_id, server, called, outcome, run_id=self._run_id)
        log.warning("run_mcp_call_refused", run_id=self._run_id, tool=name[:64], reason=reason)
