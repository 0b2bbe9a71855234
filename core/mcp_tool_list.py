"""What of a server's tool list is offered to an agent: named `<server>__<tool>`, allowed by the operator,
its schema a valid JSON Schema of an object, within the bounds; every tool left out is named in a log line.

A server's tool names are its own: the prefix keeps them apart from crewbot's tools (none of which has `__`)
and from another server's. The server's descriptions and schemas are untrusted text the model reads.
"""

from __future__ import annotations

import json
import re
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
MAX_PREFIXED_NAME_CHARS = 64  # the longest tool name OpenAI's and Anthropic's APIs take
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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


def offered_tools(server: McpServer, listed: list[Any]) -> tuple[OfferedTool, ...]:
    """The tools of `listed` (the MCP SDK's Tool objects) an agent may be offered."""
    offered: list[OfferedTool] = []
    seen: set[str] = set()
    skipped = 0
    for tool in listed:
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not server.allows_tool(name):
            continue
        problem = _problem(server.name, name, getattr(tool, "input_schema", None), seen)
        if problem is not None:
            log.warning("mcp_tool_skipped", server=server.name, tool=name[:80], reason=problem)
            continue
        if len(offered) >= MAX_TOOLS_OFFERED:
            skipped += 1
            continue
        seen.add(name)
        description = str(getattr(tool, "description", None) or "")[:MAX_DESCRIPTION_CHARS]
        schema = dict(getattr(tool, "input_schema", {}))
        offered.append(OfferedTool(server.name, name, prefixed(server.name, name), description, schema))
    if skipped:
        log.warning(
            "mcp_tools_left_out",
            server=server.name,
            left_out=skipped,
            offered=MAX_TOOLS_OFFERED,
            fix="name the tools to offer in the server's `tools` list",
        )
    return tuple(offered)


def _problem(server: str, name: str, schema: object, seen: set[str]) -> str | None:
    full = prefixed(server, name)
    if not TOOL_NAME.match(name) or len(full) > MAX_PREFIXED_NAME_CHARS:
        return f"the name is not 1 to {MAX_PREFIXED_NAME_CHARS} letters, digits, `_` or `-` with its prefix"
    if name in seen:
        return "listed twice"
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "its input schema is not a JSON Schema of an object"
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError):
        return "its input schema is not JSON"
    if size > MAX_SCHEMA_CHARS:
        return f"its input schema is {size} characters, more than {MAX_SCHEMA_CHARS}"
    return _schema_problem(schema)


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
