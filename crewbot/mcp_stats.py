"""`crewbot stats` on MCP tool calls: how many, how they went, and the busiest tools with their median time.

Read from the rows core/mcp_servers.py keeps (one per call, the main agent's and subagents' alike).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from core.settings import Settings
from core.store.db import Database
from core.store.mcp_calls import McpCallRow, McpCallStore

MAX_SHOWN_TOOLS = 10


@dataclass(frozen=True, slots=True)
class ToolUse:
    tool: str  # `<server>__<tool>`
    calls: int
    median_seconds: float
    failed: int  # not `ok`


@dataclass(frozen=True, slots=True)
class McpUse:
    calls: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    tools: list[ToolUse] = field(default_factory=list)  # the busiest first


def compute_mcp(rows: list[McpCallRow]) -> McpUse:
    if not rows:
        return McpUse()
    by_tool: dict[str, list[McpCallRow]] = {}
    for row in rows:
        by_tool.setdefault(f"{row.server}__{row.tool}", []).append(row)
    tools = [
        ToolUse(name, len(calls), statistics.median(c.seconds for c in calls), sum(c.outcome != "ok" for c in calls))
        for name, calls in by_tool.items()
    ]
    tools.sort(key=lambda t: (-t.calls, t.tool))
    return McpUse(len(rows), dict(Counter(row.outcome for row in rows)), tools)


async def gather_mcp(settings: Settings, since_seconds: float, chat_id: int | None) -> McpUse:
    db = await Database.open(settings.db_path)
    try:
        rows = await McpCallStore(db).since(time.time() - since_seconds, chat_id)
    finally:
        await db.close()
    return compute_mcp(rows)


def render_mcp(use: McpUse) -> list[str]:
    if not use.calls:
        return ["MCP tool calls: none"]
    outcomes = ", ".join(f"{count} {outcome}" for outcome, count in sorted(use.outcomes.items()))
    lines = [f"MCP tool calls: {use.calls} ({outcomes})"]
    for tool in use.tools[:MAX_SHOWN_TOOLS]:
        failed = f", {tool.failed} not ok" if tool.failed else ""
        lines.append(f"  {tool.tool}: {tool.calls} calls, median {tool.median_seconds * 1000:.0f} ms{failed}")
    if len(use.tools) > MAX_SHOWN_TOOLS:
        lines.append(f"  … and {len(use.tools) - MAX_SHOWN_TOOLS} more tools")
    return lines


def mcp_json(use: McpUse) -> dict[str, Any]:
    return asdict(use)
