"""A checked connection and its piping: bytes both ways untouched, each counted against the run's budget."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable

from core.egress_rules import IpAddress
from runner.egress.refusal import BAD_GATEWAY, GATEWAY_TIMEOUT, Refused

CONNECT_SECONDS = 10.0
MAX_CONNECT_TRIES = 4  # checked addresses tried in turn, within the one deadline
CHUNK_BYTES = 64 * 1024
STREAM_LIMIT = 64 * 1024  # the server side's read buffer (the client's is the head's limit)


class ByteBudget:
    """The bytes a run may move through its door, both directions and all connections together."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    def take(self, wanted: int) -> int:
        """How many of `wanted` bytes may still go (all of them, or what is left); they count as used."""
        granted = max(0, min(wanted, self.limit - self.used))
        self.used += granted
        return granted


async def connect(
    addresses: list[IpAddress], port: int, *, seconds: float = CONNECT_SECONDS
) -> tuple[IpAddress, asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of the checked `addresses` that answers, each given an equal share of what
    is left of `seconds` (one that drops packets does not use up the others' time). Numeric only: nothing is
    looked up again here. Refused: 504 none answered in time, 502 none would connect; what each address said,
    to the client without the address (a name's addresses are the host's to know)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    tries = addresses[:MAX_CONNECT_TRIES]
    failures: list[str] = []
    shown: list[str] = []
    timed_out = 0
    for index, address in enumerate(tries):
        # An IPv4-mapped IPv6 address is its IPv4 address (it was checked as that).
        target = address.ipv4_mapped if address.version == 6 and address.ipv4_mapped else address
        share = max(0.0, deadline - loop.time()) / (len(tries) - index)
        try:
            async with asyncio.timeout(share):
                reader, writer = await asyncio.open_connection(
                    str(target), port, flags=socket.AI_NUMERICHOST, limit=STREAM_LIMIT
                )
        except TimeoutError:
            timed_out += 1
            failure = f"no answer in {share:.1f} s"
        except OSError as exc:  # not its strerror: asyncio's names the address (`Connect call failed (...)`)
            failure = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        else:
            return target, reader, writer
        shown.append(failure)
        failures.append(f"{target}: {failure}")
    status = GATEWAY_TIMEOUT if timed_out == len(tries) else BAD_GATEWAY
    said = f"could not connect on port {port}: "
    raise Refused(status, said + "; ".join(shown), said + "; ".join(failures))


class Tunnel:
    """A client's connection and the server's, piped both ways until both ends close or the tunnel is cut.

    Each direction's end is passed on as a half-close (TLS and HTTP clients rely on it). Bytes go only while
    the budget grants them; the chunk that spends it is cut short and `on_spent` is told (it cuts the run's
    tunnels, this one among them)."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        budget: ByteBudget,
        on_spent: Callable[[], None],
    ) -> None:
        self._client = client
        self._server = server
        self._budget = budget
        self._on_spent = on_spent
        self.bytes_up = 0
        self.bytes_down = 0
        self.cut_reason: str | None = None

    async def run(self, first_up: bytes = b"") -> None:
        """Pipe until both directions end; `first_up` goes to the server before the client's bytes."""
        up = asyncio.create_task(self._pipe(self._client[0], self._server[1], first_up, upward=True))
        down = asyncio.create_task(self._pipe(self._server[0], self._client[1], b"", upward=False))
        try:
            await asyncio.gather(up, down)
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            self.close()

    def cut(self, reason: str) -> None:
        """End the tunnel now: both connections dropped, whatever they still hold."""
        if self.cut_reason is None:
            self.cut_reason = reason
        for _, writer in (self._client, self._server):
            writer.transport.abort()

    def close(self) -> None:
        for _, writer in (self._client, self._server):
            writer.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes, *, upward: bool
    ) -> None:
        try:
            chunk = first or await reader.read(CHUNK_BYTES)
            while chunk and self.cut_reason is None:
                granted = self._budget.take(len(chunk))
                if granted:
                    writer.write(chunk[:granted])
                if upward:
                    self.bytes_up += granted
                else:
                    self.bytes_down += granted
                if self._budget.spent:
                    self._on_spent()
                    return
                await writer.drain()
                chunk = await reader.read(CHUNK_BYTES)
            if self.cut_reason is None and writer.can_write_eof():
                writer.write_eof()  # this direction is over; the other may still carry the answer
        except (ConnectionError, OSError):
            # One side broke: nothing more can go either way.
            for _, other in (self._client, self._server):
                other.transport.abort()
