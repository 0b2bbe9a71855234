"""Telegram being slow for one chat: requests of a method to a chat wait until the test releases them.

    tg.hold("sendMessage", chat_id)            # from now on these requests get no answer yet
    ...                                        # the bot's other chats go on as usual
    tg.release("sendMessage", chat_id, Fault.retry_after(60))  # the waiting ones get the fault

A released request without a fault is served normally; requests after the release are not held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from tests.fakes.faults import Fault
from tests.fakes.waiting import Watch

HoldKey = tuple[str, int]  # (canonical method, chat id)


@dataclass(eq=False)
class _Hold:
    released: bool = False
    fault: Fault | None = None
    waiting: int = 0


class Holds:
    """Held (method, chat) pairs; every read or write holds the fake's lock."""

    def __init__(self, lock: threading.RLock, watch: Watch, closing: Callable[[], bool]) -> None:
        self._lock = lock
        self._watch = watch
        self._closing = closing
        self._holds: dict[HoldKey, _Hold] = {}

    def hold(self, method: str, chat_id: int) -> None:
        with self._lock:
            self._holds.setdefault((method, chat_id), _Hold())

    def release(self, method: str, chat_id: int, fault: Fault | None = None) -> None:
        with self._lock:
            held = self._holds.pop((method, chat_id), None)
            if held is not None:
                held.released, held.fault = True, fault
            self._watch.notify()

    def waiting(self, method: str, chat_id: int) -> int:
        """How many requests are held right now."""
        with self._lock:
            held = self._holds.get((method, chat_id))
            return held.waiting if held is not None else 0

    async def pass_through(self, method: str, chat_id: int | None) -> Fault | None:
        """Wait while (method, chat) is held; the fault to answer with, if the release named one."""
        with self._lock:
            held = self._holds.get((method, chat_id)) if chat_id is not None else None
            if held is None:
                return None
            held.waiting += 1
            self._watch.notify()
        try:
            await self._watch.wait_for(lambda: True if held.released or self._closing() else None, None)
        finally:
            with self._lock:
                held.waiting -= 1
        return held.fault if held.released else Fault.server_error()
