"""The stall benchmark's helper processes, both sides of their line protocol: one JSON line in, one out.

The host starts each helper with `python -m MODULE` (bench.stall_junk, bench.stall_subagent) before any
window, so what the helpers do is not the host's work; the helper prints `{"ready": true, ...}` first, then
one answer line per command line, `{"error": ...}` if the command failed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from bench.common import stop_child

WAIT_SECONDS = 180.0


class Peer:
    """A helper process (`python -m MODULE`), as the host sees it; `role` names it in errors."""

    def __init__(self, role: str, module: str) -> None:
        self._role = role
        self._module = module
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Peer:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self._module,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        ready = await self._read(60.0)
        if ready.get("ready") is not True:
            raise RuntimeError(f"the {self._role} process did not start: {ready}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._process is not None:
            await stop_child(self._process)

    async def _read(self, timeout_seconds: float) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), timeout_seconds)
        if not line:
            raise RuntimeError(f"the {self._role} process ended (see the worker's log)")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def call(self, command: dict[str, Any], timeout_seconds: float = WAIT_SECONDS) -> dict[str, Any]:
        async with self._lock:
            assert self._process is not None and self._process.stdin is not None
            self._process.stdin.write(json.dumps(command).encode() + b"\n")
            await self._process.stdin.drain()
            answer = await self._read(timeout_seconds)
        if "error" in answer:
            raise RuntimeError(f"the {self._role} process failed: {answer['error']}")
        return answer


def reply(answer: dict[str, Any]) -> None:
    """The helper's side: one answer line on stdout."""
    print(json.dumps(answer), flush=True)


def failure(exc: Exception) -> dict[str, Any]:
    """The helper's answer when a command failed (the host's `Peer.call` raises it)."""
    return {"error": f"{type(exc).__name__}: {exc}"}
