"""Injected failures shared by the fake servers: what goes wrong, and a per-key queue of them."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Literal

FaultKind = Literal["error", "disconnect", "hang", "truncate"]


@dataclass(frozen=True)
class Fault:
    """One injected failure. Each fake renders `error` in its own API's error format."""

    kind: FaultKind
    status: int = 0
    description: str = ""
    retry_after_seconds: int | None = None
    sent_bytes: int | None = None  # truncate: how much of the answer's body goes out (None: half)

    @classmethod
    def error(cls, status: int, description: str, *, retry_after_seconds: int | None = None) -> Fault:
        return cls("error", status, description, retry_after_seconds)

    @classmethod
    def retry_after(cls, seconds: int = 1) -> Fault:
        """HTTP 429 with a retry-after hint (Telegram's `parameters.retry_after`, the LLM's header)."""
        return cls.error(429, f"Too Many Requests: retry after {seconds}", retry_after_seconds=seconds)

    @classmethod
    def forbidden(cls, description: str = "Forbidden: bot was kicked from the group chat") -> Fault:
        return cls.error(403, description)

    @classmethod
    def server_error(cls, description: str = "Internal Server Error") -> Fault:
        return cls.error(500, description)

    @classmethod
    def disconnect(cls) -> Fault:
        """Close the connection without an answer (the client sees a network error)."""
        return cls("disconnect")

    @classmethod
    def hang(cls) -> Fault:
        """Never answer; the request ends when the client gives up or the fake stops."""
        return cls("hang")

    @classmethod
    def truncate(cls, sent_bytes: int | None = None) -> Fault:
        """Answer with the full Content-Length but send only `sent_bytes` of the body (default half), then
        close the connection: the client sees a body cut short. Served by the Telegram fake only."""
        if sent_bytes is not None and sent_bytes < 0:
            raise ValueError(f"sent_bytes must not be negative, not {sent_bytes}")
        return cls("truncate", sent_bytes=sent_bytes)


class FaultQueue:
    """Faults waiting to be served, per key (a method name, or "file:<file_id>" for a download); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, deque[Fault]] = {}

    def add(self, key: str, fault: Fault, count: int = 1) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        with self._lock:
            self._pending.setdefault(key, deque()).extend([fault] * count)

    def take(self, key: str) -> Fault | None:
        with self._lock:
            queue = self._pending.get(key)
            return queue.popleft() if queue else None

    def pending(self, key: str) -> int:
        with self._lock:
            return len(self._pending.get(key, ()))

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()
