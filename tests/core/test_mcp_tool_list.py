"""Which listed tools are offered: the cap applied before any schema is checked, the checks off the event loop and
remembered, a schema's depth bounded (the attack: 2,000 tools of big schemas froze the loop at every listing)."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

from core.mcp_config import McpServer, parse_config
from core.mcp_tool_list import MAX_SCHEMA_DEPTH, MAX_TOOLS_OFFERED, SchemaChecks, offered_tools


class CountedChecks(SchemaChecks):
    """The real checks, noting which thread ran them and how many schemas were checked."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()
        self.checked = 0

    def problems(self, schemas: list[dict[str, Any]]) -> list[str | None]:
        self.threads.add(threading.get_ident())
        self.checked += len(schemas)
        return super().problems(schemas)


def server(**keys: Any) -> McpServer:
    return parse_config(json.dumps({"mcpServers": {"s": {"command": "x", **keys}}}), {}).servers[0]


def listed(count: int, properties: int = 60) -> list[SimpleNamespace]:
    def schema(index: int) -> dict[str, Any]:
        props = {f"p{j}_{index}": {"type": "string", "pattern": "^[a-z]+$"} for j in range(properties)}
        return {"type": "object", "properties": props}

    return [SimpleNamespace(name=f"t{i}", description="d", input_schema=schema(i)) for i in range(count)]


async def test_2000_tools_check_only_the_offered_schemas_and_in_a_thread() -> None:
    checks = CountedChecks()
    offered = await offered_tools(server(), listed(2000, properties=20), checks)
    assert len(offered) == MAX_TOOLS_OFFERED
    assert checks.checked == MAX_TOOLS_OFFERED  # not 2,000
    assert threading.get_ident() not in checks.threads


async def test_the_allowlist_picks_before_the_cap() -> None:
    checks = CountedChecks()
    offered = await offered_tools(server(tools=["t1500", "t1999"]), listed(2000, properties=2), checks)
    assert [t.tool for t in offered] == ["t1500", "t1999"] and checks.checked == 2


async def test_a_schema_checked_once_is_remembered() -> None:
    validated: list[dict[str, Any]] = []

    def validate(schema: dict[str, Any]) -> str | None:
        validated.append(schema)
        return None

    checks = SchemaChecks(validate=validate)
    tools = listed(3, properties=2)
    first = await offered_tools(server(), tools, checks)
    again = await offered_tools(server(), tools, checks)  # the server started again: the same schemas
    assert again == first and len(validated) == 3


async def test_a_deep_or_invalid_schema_is_left_out() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 5):
        deep = {"type": "object", "properties": {"a": deep}}
    tools = [
        SimpleNamespace(name="deep", description="", input_schema=deep),
        SimpleNamespace(name="bad", description="", input_schema={"type": "object", "properties": {"a": {"type": 5}}}),
        SimpleNamespace(name="good", description="", input_schema={"type": "object"}),
    ]
    assert [t.tool for t in await offered_tools(server(), tools, SchemaChecks())] == ["good"]


async def test_a_name_with_a_final_newline_is_left_out() -> None:
    """`$` matches before a final newline: a name `read\\n` would reach the model's API and fail every turn."""
    tools = [
        SimpleNamespace(name="read\n", description="", input_schema={"type": "object"}),
        SimpleNamespace(name="read", description="", input_schema={"type": "object"}),
    ]
    assert [t.name for t in await offered_tools(server(), tools, SchemaChecks())] == ["s__read"]
