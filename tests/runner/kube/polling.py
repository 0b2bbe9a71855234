"""Waiting on a cluster's state: the API is asked again until the answer holds (the tests' own timeouts bound it).

The cluster sends no events these tests could await without a watch of their own, so a condition is polled
at a short interval; what is waited for is the event itself (a pod gone, a run's status), never a delay."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
POLL_SECONDS = 0.1
WAIT_SECONDS = 120.0  # a guard only: pods start in about a second on the kit


async def until_async(check: Callable[[], Awaitable[T | None]], timeout_seconds: float = WAIT_SECONDS) -> T:
    """The first truthy answer of `check`."""
    async with asyncio.timeout(timeout_seconds):
        for _ in itertools.count():
            result = await check()
            if result:
                return result
            await asyncio.sleep(POLL_SECONDS)
    raise AssertionError("unreachable")


async def until(check: Callable[[], T | None], timeout_seconds: float = WAIT_SECONDS) -> T:
    """The first truthy answer of the blocking `check`, asked in a thread."""

    async def ask() -> T | None:
        return await asyncio.to_thread(check)

    return await until_async(ask, timeout_seconds)
