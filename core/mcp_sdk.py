"""The parts of the `mcp` SDK the bot uses: its client side only.

Importing `mcp` (or anything under `mcp.client`) runs the package's `__init__`, which imports its server side
as well (starlette, uvicorn, sse-starlette, cryptography: about 18 MiB resident). The client modules themselves
need none of it, so they are imported here with those `__init__`s deferred (core/lean_import.py). Imported by
the MCP modules at their first use: a bot with no MCP server configured never imports the SDK.
"""

from __future__ import annotations

from core.lean_import import inits_deferred

with inits_deferred("mcp", "mcp.client"):
    from mcp.client.session import ClientSession
    from mcp.client.stdio import get_default_environment
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
    from mcp_types import CONNECTION_CLOSED, PaginatedRequestParams, jsonrpc_message_adapter

__all__ = [
    "CONNECTION_CLOSED",
    "ClientSession",
    "MCPError",
    "PaginatedRequestParams",
    "SessionMessage",
    "get_default_environment",
    "jsonrpc_message_adapter",
    "streamable_http_client",
]
