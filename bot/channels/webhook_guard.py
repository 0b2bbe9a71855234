"""The webhook listener's connections: a bounded number at once, and none held idle or half-sent.

Anyone who reaches the listener can connect before the secret is checked (it is in the request's head), and
aiohttp by itself keeps a connection that sends nothing for an hour. So, whatever the connection sends:
- over `max_connections` open at once: closed as they arrive (core/capped_site.py);
- no complete request head within `head_timeout_seconds` of connecting (nothing sent, or bytes trickling in):
  closed;
- after an answer, the next request's head not complete within `keepalive_seconds`: closed. A proxy that keeps
  its connections to the bot (deploy/Caddyfile's does) reuses one for the next update: seconds, not zero.
Each kind is logged the first time (a scanner must not fill the log), the rest only counted; the counts are
logged at stop, as the listener does for refused requests (bot/channels/webhook.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import cast

from core.logging import get_logger

log = get_logger(__name__)

HEAD_TIMEOUT_SECONDS = 10.0
KEEPALIVE_SECONDS = 5.0
# What setWebhook asks Telegram for (bot/channels/webhook_watch.py): its default; Telegram allows 1 to 100.
TELEGRAM_MAX_CONNECTIONS = 40
# Telegram's connections through the proxy, the idle ones a proxy keeps for reuse, and room to spare.
MAX_CONNECTIONS = 100


class Closing(StrEnum):
    """Why the guard closed a connection."""

    OVER_CAP = "over_cap"
    HEAD_TIMEOUT = "head_timeout"
    KEEPALIVE = "keepalive"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = MAX_CONNECTIONS
    head_timeout_seconds: float = HEAD_TIMEOUT_SECONDS
    keepalive_seconds: float = KEEPALIVE_SECONDS


class ConnectionGuard:
    """One listener's connections: the deadline of each, and the count of those closed, by kind."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.closed: Counter[Closing] = Counter()  # connections refused or closed by the guard, by kind
        self._watched: dict[asyncio.Protocol, _Watched] = {}  # by aiohttp's handler of the connection

    def over_cap(self) -> None:
        self.count(Closing.OVER_CAP)

    def watch(self, handler: asyncio.Protocol) -> asyncio.Protocol:
        """The protocol the loop drives for an admitted connection: aiohttp's `handler`, with its deadline."""
        return _Watched(handler, self._watched, self.limits.head_timeout_seconds, self.count)

    def request_began(self, handler: asyncio.Protocol) -> None:
        """A request's head arrived on `handler`'s connection: no deadline while it is answered."""
        watched = self._watched.get(handler)
        if watched is not None:
            watched.disarm()

    def request_ended(self, handler: asyncio.Protocol) -> None:
        """Answered: the next request's head is due within the keep-alive."""
        watched = self._watched.get(handler)
        if watched is not None:
            watched.arm(self.limits.keepalive_seconds, Closing.KEEPALIVE)

    def log_counts(self) -> None:
        if self.closed:
            log.info("webhook_connections_closed", counts=dict(self.closed))

    def count(self, kind: Closing) -> None:
        self.closed[kind] += 1
        if self.closed[kind] == 1:
            # The keep-alive ending is routine (the proxy reconnects); the others are refusals.
            (log.info if kind is Closing.KEEPALIVE else log.warning)(
                "webhook_connection_closed",
                kind=kind,
                note="further ones of this kind are counted, not logged (the counts are logged at stop)",
            )


class _Watched(asyncio.Protocol):
    """aiohttp's handler of one connection, passed everything the loop tells it, closed at its deadline."""

    __slots__ = ("_count", "_handler", "_head_timeout_seconds", "_open", "_timer", "_transport")

    def __init__(
        self,
        handler: asyncio.Protocol,
        open_ones: dict[asyncio.Protocol, _Watched],
        head_timeout_seconds: float,
        count: Callable[[Closing], None],
    ) -> None:
        self._handler = handler
        self._open = open_ones
        self._head_timeout_seconds = head_timeout_seconds
        self._count = count
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a server's connection is a stream
        self._open[self._handler] = self
        self.arm(self._head_timeout_seconds, Closing.HEAD_TIMEOUT)
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        # Bytes do not move the deadline: a head trickling in is cut as an idle connection is.
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self._open.pop(self._handler, None)
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def arm(self, seconds: float, kind: Closing) -> None:
        self.disarm()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire, kind)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, kind: Closing) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._count(kind)
            # Not close(): that waits for the write buffer to drain, which a client that never reads holds.
            self._transport.abort()
