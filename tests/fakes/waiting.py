"""Event-driven waits on a fake's state that work from any thread and any event loop.

A fake may serve on its own thread (the bot under test runs in a subprocess) while the test awaits on
the main loop, so wake-ups go through `call_soon_threadsafe` rather than an asyncio.Condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# A predicate returns the value the waiter wants once the state satisfies it, else None.
Predicate = Callable[[], T | None]


@dataclass(eq=False)
class _Waiter:
    predicate: Callable[[], object]
    wake: Callable[[Any], None]


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


class Watch:
    """Waiters on state guarded by `lock`; whoever changes that state calls `notify()` holding it."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._waiters: list[_Waiter] = []

    async def wait_for(self, predicate: Predicate[T], timeout_seconds: float | None) -> T:
        """The predicate's first non-None value; TimeoutError after `timeout_seconds` (None: never)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def wake(value: T) -> None:
            # RuntimeError: the waiting loop has closed, nobody is left to wake
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, future, value)

        with self._lock:
            value = predicate()
            if value is not None:
                return value
            waiter = _Waiter(predicate, wake)
            self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_seconds):
                return await future
        finally:
            self._discard(waiter)

    def wait_for_sync(self, predicate: Predicate[T], timeout_seconds: float | None) -> T:
        """Blocking variant for code outside any event loop."""
        event = threading.Event()
        box: list[T] = []

        def wake(value: T) -> None:
            box.append(value)
            event.set()

        with self._lock:
            value = predicate()
            if value is not None:
                return value
            waiter = _Waiter(predicate, wake)
            self._waiters.append(waiter)
        try:
            if not event.wait(timeout_seconds):
                raise TimeoutError
            return box[0]
        finally:
            self._discard(waiter)

    def notify(self) -> None:
        """Re-check every waiter; call with the lock held, after the state changed."""
        with self._lock:
            for waiter in list(self._waiters):
                value = waiter.predicate()
                if value is not None:
                    self._waiters.remove(waiter)
                    waiter.wake(value)

    def _discard(self, waiter: _Waiter) -> None:
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
