"""Real MCP servers for the tests (tests/fakes/mcp_server.py): a stdio entry of an `mcpServers` file, a streamable
HTTP one started on 127.0.0.1, and a config file written from entries."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

SERVER_MODULE = "tests.fakes.mcp_server"
REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_SECONDS = 30.0


def stdio_entry(*flags: str, **keys: Any) -> dict[str, Any]:
    """An `mcpServers` entry that starts the test server over stdio, plus crewbot's keys (`tools`, `use`, …)."""
    return {"command": sys.executable, "args": ["-m", SERVER_MODULE, *flags], "cwd": str(REPO_ROOT), **keys}


def write_config(path: Path, servers: dict[str, dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def http_server(*flags: str) -> AsyncIterator[str]:
    """The test server over streamable HTTP on 127.0.0.1; yields its URL, stops it after."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        SERVER_MODULE,
        "--http",
        str(port),
        *flags,
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            while not await _listening(port):
                if process.returncode is not None:
                    raise RuntimeError(f"the MCP test server exited with {process.returncode}")
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            async with asyncio.timeout(10):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


async def _listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True
