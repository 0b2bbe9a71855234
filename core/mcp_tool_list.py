"""What of a server's tool list is offered to an agent: named `<server>__<tool>`, allowed by the operator,
its schema a valid JSON Schema of an object, within the bounds; every tool left out is named in a log line.
The cap on tools offered is applied before any schema is checked, and the checks run in a thread.

A server's tool names are its own: the prefix keeps them apart from crewbot's tools (none of which has `__`)
and from another server's. The server's descriptions and schemas are untrusted text the model reads.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.logging import get_logger
from core.mcp_config import McpServer

log = get_logger(__name__)

SEPARATOR = "__"
MAX_TOOLS_LISTED = 2_000  # read of one server's list (pages included); the rest is not read
MAX_TOOLS_OFFERED = 100  # per server, offered to a model: a `tools` allowlist picks which
MAX_DESCRIPTION_CHARS = 1_000
MAX_SCHEMA_CHARS = 8_000  # a tool's argument schema as JSON
MAX_SCHEMA_DEPTH = 32  # objects and lists nested in one schema
MAX_REMEMBERED_SCHEMAS = 4_096  # checked schemas remembered, all servers together (each a hash and a reason)
MAX_PREFIXED_NAME_CHARS = 64  # the longest tool name OpenAI's and Anthropic's APIs take
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # whole name: fullmatch (`$` would let a final newline in)


@dataclass(frozen=True, slots=True)
class OfferedTool:
    """One tool as an agent sees it; `tool` is the server's own name, used when calling."""

    server: str
    tool: str
    name: str  # `<server>__<tool>`
    description: str
    schema: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        """As the subagent's model step takes a tool."""
        return {"name": self.name, "description": self.description, "parameters": self.schema}


def prefixed(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


def split_name(name: str) -> tuple[str, str] | None:
    """(server, tool) of a prefixed name; None when it is not one."""
    server, separator, tool = name.partition(SEPARATOR)
    return (server, tool) if separator and server and tool else None


async def offered_tools(server: McpServer, listed: list[Any], checks: SchemaChecks) -> tuple[OfferedTool, ...]:
    """The tools of `listed` (the MCP SDK's Tool objects) an agent may be offered.

    On the loop only what is cheap per tool (its name, the allowlist, duplicates), so that at most
    MAX_TOOLS_OFFERED are picked before any schema is measured or checked: a list of 2,000 tools costs the
    loop microseconds per tool. Their schemas are then checked in a thread, each distinct schema once."""
    picked: list[OfferedTool] = []
    seen: set[str] = set()
    left_out = 0
    for tool in listed:
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not server.allows_tool(name):
            continue
        problem = _name_problem(server.name, name, getattr(tool, "input_schema", None), seen)
        if problem is not None:
            log.warning("mcp_tool_skipped", server=server.name, tool=name[:80], reason=problem)
            continue
        seen.add(name)
        if len(picked) >= MAX_TOOLS_OFFERED:
            left_out += 1
            continue
        description = str(getattr(tool, "description", None) or "")[:MAX_DESCRIPTION_CHARS]
        schema = dict(getattr(tool, "input_schema", {}))
        picked.append(OfferedTool(server.name, name, prefixed(server.name, name), description, schema))
    if left_out:
        log.warning(
            "mcp_tools_left_out",
            server=server.name,
            left_out=left_out,
            offered=MAX_TOOLS_OFFERED,
            fix="name the tools to offer in the server's `tools` list",
        )
    problems = await asyncio.to_thread(checks.problems, [tool.schema for tool in picked]) if picked else []
    offered = []
    for tool, problem in zip(picked, problems, strict=True):
        if problem is None:
            offered.append(tool)
        else:
            log.warning("mcp_tool_skipped", server=server.name, tool=tool.tool[:80], reason=problem)
    return tuple(offered)


class SchemaChecks:
    """Whether argument schemas are usable, remembered by the hash of their JSON: a server started again (after a
    crash, a reload) costs no second check of the same schemas. Blocking: call `problems` in a thread."""

    def __init__(
        self,
        max_remembered: int = MAX_REMEMBERED_SCHEMAS,
        validate: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        self._max_remembered = max_remembered
        self._validate = validate if validate is not None else _schema_problem
        self._known: OrderedDict[str, str | None] = OrderedDict()
        self._lock = threading.Lock()  # two servers' lists may be checked in two threads at once

    def problems(self, schemas: list[dict[str, Any]]) -> list[str | None]:
        return [self._problem(schema) for schema in schemas]

    def _problem(self, schema: dict[str, Any]) -> str | None:
        depth = _depth(schema)
        if depth > MAX_SCHEMA_DEPTH:
            return f"its input schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
        try:
            text = json.dumps(schema, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            return "its input schema is not JSON"
        if len(text) > MAX_SCHEMA_CHARS:
            return f"its input schema is {len(text)} characters, more than {MAX_SCHEMA_CHARS}"
        key = hashlib.sha256(text.encode()).hexdigest()
        with self._lock:
            if key in self._known:
                self._known.move_to_end(key)
                return self._known[key]
        problem = self._validate(schema)
        with self._lock:
            self._known[key] = problem
            while len(self._known) > self._max_remembered:
                self._known.popitem(last=False)
        return problem


def _name_problem(server: str, name: str, schema: object, seen: set[str]) -> str | None:
    full = prefixed(server, name)
    if not TOOL_NAME.fullmatch(name) or len(full) > MAX_PREFIXED_NAME_CHARS:
        return f"the name is not 1 to {MAX_PREFIXED_NAME_CHARS} letters, digits, `_` or `-` with its prefix"
    if name in seen:
        return "listed twice"
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "its input schema is not a JSON Schema of an object"
    return None


def _depth(value: object) -> int:
    """How deep dicts and lists nest, without recursion (a deep schema cannot exhaust the stack), stopping once
    past MAX_SCHEMA_DEPTH."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        deepest = max(deepest, depth)
        if depth > MAX_SCHEMA_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _schema_problem(schema: dict[str, Any]) -> str | None:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        return f"its input schema is not valid JSON Schema: {str(exc.message)[:200]}"
    except Exception as exc:  # a `$schema` naming an unknown draft, a recursion, …
        return f"its input schema cannot be checked: {type(exc).__name__}"
    return None
