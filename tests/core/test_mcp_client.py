"""One connection's calls against the real test server: results and errors redacted of the server's secrets before
any cut; a call that times out fails alone (the connection others use stays); a call not wanted any more is not
made; a caller's bad arguments leave the connection to the others."""

from __future__ import annotations

import asyncio
import json
from base64 import b64encode
from collections.abc import AsyncIterator
from urllib.parse import quote, quote_plus

import pytest

from core.mcp_client import MAX_ERROR_CHARS, CallStatus, McpConnection, redact
from core.mcp_config import McpServer, parse_config
from tests.mcp_helpers import stdio_entry

SECRET = "ghp_SuperSecretToken1234567890"


def server(timeout_seconds: float = 60) -> McpServer:
    entry = stdio_entry(env={"DEMO_TOKEN": "${T}"}, timeout_seconds=timeout_seconds)
    return parse_config(json.dumps({"mcpServers": {"s": entry}}), {"T": SECRET}).servers[0]


@pytest.fixture
async def connection() -> AsyncIterator[McpConnection]:
    opened = McpConnection(server(timeout_seconds=4))
    yield opened
    await opened.close()


async def test_results_and_tool_errors_are_redacted(connection: McpConnection) -> None:
    echoed = await connection.call("env_echo", {"name": "DEMO_TOKEN"})
    assert echoed.status is CallStatus.OK and SECRET not in echoed.text and "<redacted>" in echoed.text
    failed = await connection.call("env_fail", {"name": "DEMO_TOKEN"})
    assert failed.status is CallStatus.TOOL_ERROR and SECRET not in failed.text and "<redacted>" in failed.text
    # Redacted before the cut: a secret across the cut leaves no prefix.
    cut = await connection.call("env_echo", {"name": "DEMO_TOKEN"}, max_chars=len("debug: DEMO_TOKEN=") + 8)
    assert SECRET[:8] not in cut.text


def test_a_secret_in_its_usual_encodings_is_redacted() -> None:
    """Echoed as it travels: URL-encoded in a query, base64 in a Basic header (redaction stays best effort)."""
    token = "sk-live/ab+cd=&secret"
    entry = stdio_entry(env={"DEMO_TOKEN": "${T}"})
    connection = McpConnection(parse_config(json.dumps({"mcpServers": {"s": entry}}), {"T": token}).servers[0])
    said = f"url ?k={quote(token, safe='')} form k={quote_plus(token)} basic {b64encode(token.encode()).decode()}"
    text = redact(connection.server, said)
    assert text.count("<redacted>") == 3, text


def test_an_error_is_redacted_before_it_is_cut() -> None:
    connection = McpConnection(server())
    error = RuntimeError("upstream said: " + "." * 270 + " token " + SECRET + " rejected")
    text = connection._reason("", error)
    assert len(text) <= MAX_ERROR_CHARS and SECRET[:12] not in text


async def test_one_timeout_fails_alone(connection: McpConnection) -> None:
    await connection.tools()

    async def other_chat() -> CallStatus:
        await asyncio.sleep(2)  # in flight when the first call times out (at 4 s), done 1 s after
        return (await connection.call("slow", {"seconds": 3})).status

    timed_out, other = await asyncio.gather(connection.call("slow", {"seconds": 999}), other_chat())
    assert timed_out.status is CallStatus.TIMEOUT and other is CallStatus.OK


async def test_bad_arguments_leave_the_connection(connection: McpConnection) -> None:
    await connection.tools()

    async def other_chat() -> CallStatus:
        return (await connection.call("slow", {"seconds": 1})).status

    other = asyncio.create_task(other_chat())
    await asyncio.sleep(0.3)
    bad = await connection.call("add", {"a": "not a number", "b": []})
    assert bad.status in (CallStatus.FAILED, CallStatus.TOOL_ERROR)
    assert await other is CallStatus.OK


async def test_a_call_not_wanted_any_more_is_not_made(connection: McpConnection) -> None:
    outcome = await connection.call("echo", {"text": "x"}, still_wanted=lambda: False)
    assert outcome.status is CallStatus.REFUSED and "has ended" in outcome.text
