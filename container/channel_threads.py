"""The run channel's blocking requests, each in a daemon thread of its own: one still blocked when the run
stops does not hold the process up."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_daemon_thread(work: Callable[[], T]) -> T:
    """`work()` in a daemon thread: unlike the default executor's, it never delays the process's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not done.done():
            outcome()

    def run() -> None:
        try:
            value = work()
        except BaseException as exc:
            error = exc
            _call_soon(loop, lambda: settle(lambda: done.set_exception(error)))
        else:
            _call_soon(loop, lambda: settle(lambda: done.set_result(value)))

    threading.Thread(target=run, daemon=True, name="run-channel").start()
    return await done


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for this answer any more
        loop.call_soon_threadsafe(callback)
