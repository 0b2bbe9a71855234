"""What every benchmark worker shares: its context, settings, logging, the loopback guard and waiting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from core.settings import Settings, load_settings

T = TypeVar("T")

# Chat ids handed to one worker: `chat_base - k` for k below this. Containers of the run carry them in
# their `crewbot.chat_id` label, which is how the orchestrator finds (only) its own containers.
CHATS_PER_WORKER = 10_000
POLL_SECONDS = 0.05


@dataclass(slots=True)
class BenchContext:
    quick: bool
    chat_base: int  # a Telegram supergroup id; this worker's chats count down from it
    work_dir: Path  # short path (Unix sockets live under it), removed afterwards
    notes: list[str] = field(default_factory=list)

    def chat_id(self, index: int) -> int:
        if not 0 <= index < CHATS_PER_WORKER:
            raise ValueError(f"chat index {index} outside this worker's range")
        return self.chat_base - index

    def note(self, text: str) -> None:
        self.notes.append(text)

    def scaled(self, full: int, quick: int) -> int:
        return quick if self.quick else full


def bench_settings(
    data_dir: Path, *, token: str | None = None, base_url: str | None = None, **overrides: Any
) -> Settings:
    """Production defaults except where a benchmark says otherwise; offline model; warnings only."""
    values: dict[str, Any] = {
        "DATA_DIR": data_dir,
        "LLM_PROVIDER": "offline",
        "LOG_LEVEL": "WARNING",
        "SUBAGENT_NETWORK": "none",
        # The cold path unless a benchmark asks for a warm pool (bench/warm_pool.py measures it).
        "SUBAGENT_WARM_POOL": 0,
    }
    if token is not None:
        values["TELEGRAM_BOT_TOKEN"] = token
    if base_url is not None:
        values["TELEGRAM_API_BASE_URL"] = base_url
    values.update(overrides)
    return load_settings(**values)


async def poll_until(
    probe: Callable[[], Awaitable[T | None]], timeout_seconds: float, what: str, interval: float = POLL_SECONDS
) -> T:
    """The probe's first non-None value, looked for every `interval` seconds."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = await probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_seconds:g} s waiting for {what}")
        await asyncio.sleep(interval)


async def wait_event(event: asyncio.Event, timeout_seconds: float, what: str) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout_seconds)
    except TimeoutError:
        raise TimeoutError(f"timed out after {timeout_seconds:g} s waiting for {what}") from None


def ms(seconds: float) -> float:
    return seconds * 1000.0


CHILD_EXIT_SECONDS = 10.0


async def stop_child(process: asyncio.subprocess.Process) -> None:
    """End a helper process this benchmark started: close its stdin (its cue to leave), kill it if it lingers."""
    if process.stdin is not None:
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), CHILD_EXIT_SECONDS)
    except TimeoutError:
        process.kill()  # our own child
        await process.wait()
