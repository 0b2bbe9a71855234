"""`crewbot doctor`'s MCP lines: the MCP_SERVERS file checked, then each server started (or reached), its tools
listed, one line each; a failure says what was tried and how to fix it. Nothing secret is printed: a server is
named by its command line or URL, which the config's rules keep free of secrets (core/mcp_config.py), and its
errors are redacted of its `env` and `headers` values."""

from __future__ import annotations

import asyncio
from pathlib import Path

from core.mcp_client import CONNECT_TIMEOUT_SECONDS, McpConnection, ServerUnavailable
from core.mcp_config import McpConfigError, McpServer, Transport, environ_with_env_file, load_config
from core.settings import Settings
from crewbot.doctor_result import CheckResult, fail

MAX_NAMED_TOOLS = 8
MAX_WHERE_CHARS = 100
CONFIG_FIX = "correct the file (docs/mcp.md says what a server's entry holds)"


async def check_mcp(settings: Settings) -> list[tuple[str, CheckResult]]:
    path = settings.mcp_servers
    if path is None:
        return [("mcp", CheckResult("skip", "MCP_SERVERS is not set: no MCP servers"))]
    try:
        environ = await asyncio.to_thread(environ_with_env_file, settings_env_file())
        config = await asyncio.to_thread(load_config, path, environ)
    except McpConfigError as exc:
        return [("mcp", fail(str(exc), CONFIG_FIX))]
    if not config.servers:
        return [("mcp", CheckResult("ok", f"{path}: no servers enabled"))]
    checks = await asyncio.gather(*(check_server(server) for server in config.servers))
    return [(f"mcp {server.name}", result) for server, result in zip(config.servers, checks, strict=True)]


async def check_server(server: McpServer) -> CheckResult:
    connection = McpConnection(server)
    where = server.where[:MAX_WHERE_CHARS]
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS + server.timeout_seconds):
            tools = await connection.tools()
    except ServerUnavailable as exc:
        return fail(f"{where}: {exc}", _fix(server, str(exc)))
    except TimeoutError:
        return fail(
            f"{where}: no answer within {CONNECT_TIMEOUT_SECONDS + server.timeout_seconds:g} s", _fix(server, "")
        )
    finally:
        await connection.close()
    uses = ", ".join(sorted(use.value for use in server.use))
    if not tools:
        fix = "the `tools` list names none of its tools" if server.tools is not None else "see the server's docs"
        return fail(f"{where}: started, but offers no usable tool", fix)
    names = ", ".join(t.tool for t in tools[:MAX_NAMED_TOOLS]) + (" …" if len(tools) > MAX_NAMED_TOOLS else "")
    return CheckResult("ok", f"{where}: {len(tools)} tools for {uses} ({names})")


def _fix(server: McpServer, reason: str) -> str:
    lowered = reason.lower()
    if server.transport is Transport.STDIO:
        if "no such file" in lowered or "not found" in lowered:
            return "install the server, or give the full path of its program in `command`"
        return f"run `{server.where[:MAX_WHERE_CHARS]}` in a shell as the bot's user and read what it prints"
    if "401" in lowered or "403" in lowered or "unauthori" in lowered or "forbidden" in lowered:
        return "check the token the server's `headers` send (a ${VAR} set in the bot's environment)"
    if "redirect" in lowered:
        return "use the URL the server redirects to as `url` (redirects are not followed)"
    return "check that the server runs and that `url` is its streamable HTTP endpoint (often ending in /mcp)"


def settings_env_file() -> str | None:
    """The env file Settings reads (`.env` in the working directory), whose variables `${VAR}` may name too."""
    env_file = Settings.model_config.get("env_file")
    return str(env_file) if isinstance(env_file, str | Path) else None
