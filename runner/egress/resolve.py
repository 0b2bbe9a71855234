"""Where a request may go: the rules' check of what was asked for, then the addresses it resolves to.

A name is resolved once per connection, on the host, and the door connects only to an address returned
here: a second lookup (which a hostile name server could answer differently) never happens. Of the answer,
the addresses that pass the address check are kept, in the resolver's order; when none passes the request
is refused with the first address's rule. Keeping the passing ones (rather than refusing an answer that
mixes public and private addresses) is safe because only a checked address is ever connected to. The
client is told which rule refused a name, never what it resolved to (the detail keeps that, for the
operator): the door is no resolver for a container that has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from core.egress_rules import IpAddress, address_refusal, literal_address, request_refusal, unwrapped
from runner.egress.records import EgressRules
from runner.egress.refusal import BAD_GATEWAY, FORBIDDEN, GATEWAY_TIMEOUT, Refused

Resolver = Callable[[str, int], Awaitable[list[IpAddress]]]

RESOLVE_SECONDS = 10.0
MAX_ADDRESSES = 16  # of one answer: a name with hundreds of addresses is checked no further
# Lookups run in threads of their own: a slow name server (or a run asking for thousands of slow names)
# then holds these, never the default executor the rest of the bot reads and writes files with.
DNS_THREADS = 8
LOOKUPS_PER_DOOR = 2  # a run's lookups at once: it cannot hold more than its share of the threads
# What one lookup costs the run's byte budget, an estimate of the traffic it causes from the host: getaddrinfo
# asks twice (A and AAAA), and each question and its answer carry the name and about 48 bytes besides (IP and
# UDP headers 28, DNS header 12, type and class 4, the name's framing 2, rounded up; answers' records aside).
DNS_MESSAGES_PER_LOOKUP = 4
DNS_MESSAGE_OVERHEAD_BYTES = 48

SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
IF_INET6 = Path("/proc/net/if_inet6")
FIB_TRIE = Path("/proc/net/fib_trie")


def request_check(rules: EgressRules, host: str, port: int) -> None:
    """Refused (403) unless the rules allow what the client asked for, as it asked for it."""
    refusal = request_refusal(rules.mode, rules.allow, host, port)
    if refusal is not None:
        raise Refused(FORBIDDEN, refusal)


def lookup_bytes(host: str) -> int:
    """What looking `host` up is counted as in the run's byte budget: a 253-byte name, about 1.2 KB."""
    return DNS_MESSAGES_PER_LOOKUP * (len(host.encode()) + DNS_MESSAGE_OVERHEAD_BYTES)


async def checked_addresses(
    rules: EgressRules,
    host: str,
    port: int,
    *,
    resolver: Resolver,
    own: frozenset[IpAddress],
    seconds: float = RESOLVE_SECONDS,
) -> list[IpAddress]:
    """The addresses `host` may be reached at on `port`, after request_check: a literal address is itself
    (no lookup), a name is resolved once. Refused: 403 none passes, 502 no answer, 504 the lookup was slow."""
    literal = literal_address(host)
    if literal is not None:
        answer = [literal]
    else:
        try:
            async with asyncio.timeout(seconds):
                answer = (await resolver(host, port))[:MAX_ADDRESSES]
        except TimeoutError as exc:
            raise Refused(GATEWAY_TIMEOUT, f"resolving {host[:80]} took over {seconds:g} s") from exc
        except OSError as exc:  # socket.gaierror among them
            raise Refused(BAD_GATEWAY, f"{host[:80]} did not resolve: {exc.strerror or exc}") from exc
        if not answer:
            raise Refused(BAD_GATEWAY, f"{host[:80]} resolved to no address")
    checked = [(address, address_refusal(address, port, rules.allow, own)) for address in answer]
    passing = [address for address, refusal in checked if refusal is None]
    if passing:
        return passing
    address, first = next((address, refusal) for address, refusal in checked if refusal is not None)
    if literal is not None:  # the client's own words, and the rule: nothing it did not know
        raise Refused(FORBIDDEN, f"{host[:80]} is {first.rule}", first.detail)
    raise Refused(
        FORBIDDEN, f"{host[:80]} resolves to {first.rule}", f"{host[:80]} resolves to {address}: {first.detail}"
    )


class SystemLookups:
    """The host's own lookups (getaddrinfo, TCP) in threads of their own, shared by every door; each door gets
    a resolver of its own (`for_door`) that holds at most LOOKUPS_PER_DOOR lookups at once. A lookup the door
    stopped waiting for (its deadline) keeps its place until its thread returns: a run that asks for names no
    server answers fills only its own places, never the threads every other run resolves with."""

    def __init__(self, threads: int = DNS_THREADS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="egress-dns")

    def for_door(self, max_in_flight: int = LOOKUPS_PER_DOOR) -> Resolver:
        places = asyncio.Semaphore(max_in_flight)

        async def resolve(host: str, port: int) -> list[IpAddress]:
            loop = asyncio.get_running_loop()
            await places.acquire()
            lookup = partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
            try:
                pending: Future[list[Any]] = self._pool.submit(lookup)
            except BaseException:
                places.release()
                raise
            # Released when the thread is done, not when the door stops waiting for it.
            pending.add_done_callback(lambda _: _call_soon(loop, places.release))
            infos: list[Any] = await asyncio.wrap_future(pending)
            return _addresses(infos)

        return resolve

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for the place any more
        loop.call_soon_threadsafe(callback)


def _addresses(infos: Iterable[tuple[Any, ...]]) -> list[IpAddress]:
    """getaddrinfo's answer as addresses, in its order, each once."""
    found: list[IpAddress] = []
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(sockaddr[0])
        if address not in found:
            found.append(address)
    return found


def own_addresses() -> frozenset[IpAddress]:
    """This host's addresses, as far as the standard library can see them: its name's, its interfaces'
    (IPv6 from /proc/net/if_inet6, IPv4 from SIOCGIFADDR and the kernel's local routes). Blocking: call it
    in a thread. A public address among them is refused like a private one (the bot's own ports are there)."""
    found: set[IpAddress] = set()
    for source in (_hostname_addresses, _ipv6_interfaces, _ipv4_interfaces, _ipv4_local_routes):
        with contextlib.suppress(OSError, ValueError):
            found.update(unwrapped(address) for address in source())  # the form address_refusal compares
    return frozenset(found)


def _hostname_addresses() -> Iterator[IpAddress]:
    for name in {socket.gethostname(), socket.getfqdn()}:
        with contextlib.suppress(OSError):
            for *_, sockaddr in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM):
                yield ipaddress.ip_address(sockaddr[0])


def _ipv6_interfaces() -> Iterator[IpAddress]:
    # Each line: the address as 32 hex digits, then index, prefix length, scope, flags and the interface.
    for line in IF_INET6.read_text().splitlines():
        fields = line.split()
        if fields and len(fields[0]) == 32:
            yield ipaddress.IPv6Address(bytes.fromhex(fields[0]))


def _ipv4_interfaces() -> Iterator[IpAddress]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:  # an interface without an IPv4 address
                continue
            yield ipaddress.IPv4Address(reply[20:24])


def _ipv4_local_routes() -> Iterable[IpAddress]:
    """Every local IPv4 address (secondary ones too, which SIOCGIFADDR does not show): the kernel's
    routing trie marks each as `/32 host LOCAL` under the line that names it."""
    found: list[IpAddress] = []
    previous = ""
    for line in FIB_TRIE.read_text().splitlines():
        text = line.strip()
        if text.startswith("/32 host LOCAL") and previous.startswith("|-- "):
            found.append(ipaddress.IPv4Address(previous[4:]))
        previous = text
    return found
