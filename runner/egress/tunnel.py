"""A checked connection and its piping: bytes both ways untouched, each counted against the run's budget.

The piping is `container.splice`'s relay: two threads a tunnel, the bytes spliced through a pipe each way, so the
bot's event loop is not on their path; the budget is taken from those threads (hence its lock)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Callable

from container.splice import RelayEnd, SpliceRelay
from core.egress_rules import IpAddress
from runner.egress.refusal import BAD_GATEWAY, GATEWAY_TIMEOUT, Refused

CONNECT_SECONDS = 10.0
MAX_CONNECT_TRIES = 4  # checked addresses tried in turn, within the one deadline


class ByteBudget:
    """The bytes a run may move through its door, both directions and all connections together; its tunnels'
    threads take from it at once."""

    __slots__ = ("_lock", "limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    def take(self, wanted: int) -> int:
        """How many of `wanted` bytes may still go (all of them, or what is left); they count as used."""
        with self._lock:
            granted = max(0, min(wanted, self.limit - self.used))
            self.used += granted
        return granted


async def connect(
    addresses: list[IpAddress], port: int, *, seconds: float = CONNECT_SECONDS
) -> tuple[IpAddress, socket.socket]:
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
        sock = socket.socket(socket.AF_INET6 if target.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            async with asyncio.timeout(share):
                await loop.sock_connect(sock, (str(target), port))
        except TimeoutError:
            sock.close()
            timed_out += 1
            failure = f"no answer in {share:.1f} s"
        except OSError as exc:  # not its strerror: it may name the address
            sock.close()
            failure = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        except BaseException:
            sock.close()
            raise
        else:
            return target, sock
        shown.append(failure)
        failures.append(f"{target}: {failure}")
    status = GATEWAY_TIMEOUT if timed_out == len(tries) else BAD_GATEWAY
    said = f"could not connect on port {port}: "
    raise Refused(status, said + "; ".join(shown), said + "; ".join(failures))


class Tunnel:
    """A client's connection and the server's, piped both ways until both ends close or the tunnel is cut.

    Each direction's end is passed on as a half-close (TLS and HTTP clients rely on it). Bytes go only while
    the budget grants them; the chunk that spends it is cut short and `on_spent` is told (it cuts the run's
    tunnels, this one among them). Both sockets are the tunnel's: closed when `run()` ends."""

    def __init__(
        self, client: socket.socket, server: socket.socket, budget: ByteBudget, on_spent: Callable[[], None]
    ) -> None:
        self._client = client
        self._server = server
        self._relay = SpliceRelay(client, server, allowance=budget, on_spent=on_spent)
        self.cut_reason: str | None = None

    @property
    def bytes_up(self) -> int:
        return self._relay.bytes_forward

    @property
    def bytes_down(self) -> int:
        return self._relay.bytes_back

    async def run(self, first_up: bytes = b"") -> RelayEnd:
        """Pipe until both directions end; `first_up` goes to the server before the client's bytes."""
        try:
            return await self._relay.run(forward_first=first_up)
        finally:
            self.close()

    def cut(self, reason: str) -> None:
        """End the tunnel now: both connections dropped, whatever they still hold."""
        if self.cut_reason is None:
            self.cut_reason = reason
        self._relay.cut()

    def close(self) -> None:
        for sock in (self._client, self._server):
            with contextlib.suppress(OSError):
                sock.close()
