"""The bounded stdio transport against the real test server: a line that never ends stops at MAX_MESSAGE_BYTES
with a clear reason, its memory bounded and the loop free (the SDK's reader grew it without end, re-joining its
buffer at each chunk); the server's stderr is logged cut and redacted, never the bot's own stderr."""

from __future__ import annotations

import asyncio
import json
import resource
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from core.mcp_client import CallStatus, McpConnection, ServerUnavailable
from core.mcp_config import McpServer, parse_config
from core.mcp_stdio import MAX_MESSAGE_BYTES, MAX_STDERR_LINE_CHARS, MAX_STDERR_LINES
from tests.mcp_helpers import stdio_entry

SECRET = "s3cret-token-value-123"


def server(args_extra: tuple[str, ...] = ()) -> McpServer:
    entry = stdio_entry(*args_extra, env={"DEMO_TOKEN": "${T}"}, timeout_seconds=120)
    return parse_config(json.dumps({"mcpServers": {"s": entry}}), {"T": SECRET}).servers[0]


@pytest.fixture
async def connection() -> AsyncIterator[McpConnection]:
    opened = McpConnection(server())
    yield opened
    await opened.close()


async def test_an_unterminated_line_ends_the_connection_bounded() -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    warm = McpConnection(server())  # the SDK's modules loaded first: only the flood's memory is measured
    await warm.tools()
    await warm.close()
    flooding = McpConnection(server(args_extra=("--flood", str(64 * 1024 * 1024))))
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ticker = asyncio.create_task(tick())
    try:
        with pytest.raises(ServerUnavailable, match="over 4 MiB"):
            await flooding.tools()
    finally:
        ticker.cancel()
        await flooding.close()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib) / 1024
    # 64 MiB were sent on one line; at most about twice the limit is ever buffered (the pipe pauses there).
    assert grown_mib < 3 * MAX_MESSAGE_BYTES / (1024 * 1024)
    assert ticks > 5  # the loop kept running through it (a generous bound: the read takes many ticks)


async def test_stderr_is_logged_redacted_cut_and_bounded(connection: McpConnection) -> None:
    with capture_logs() as logs:
        outcome = await connection.call("shout", {"n": MAX_STDERR_LINES + 50})
        await connection.close()  # the reader has read everything once the process is gone
    assert outcome.status is CallStatus.OK
    lines = [entry["line"] for entry in logs if entry["event"] == "mcp_server_stderr"]
    assert len(lines) == MAX_STDERR_LINES
    assert all(SECRET[:8] not in line and len(line) <= MAX_STDERR_LINE_CHARS for line in lines)
    assert lines[0] == "wrapped DEMO_TOKEN=<redacted>"  # its first 20 characters, the rest on the next line
    assert any("DEMO_TOKEN=<redacted>" in line for line in lines)
    assert any(entry["event"] == "mcp_server_stderr_dropped" for entry in logs)
