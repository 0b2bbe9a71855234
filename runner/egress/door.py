"""A run's door: the Unix socket its container's forwarder connects to, once per client connection.

Each connection is one request: its head is read under a size cap and a deadline, checked against the
run's rules, and carried through a tunnel to an address the door checked itself. What a run can hold is
bounded: connections still sending their head or being refused (MAX_OPENING; more are answered 429 as
they arrive, unread), connections carried at once (the rules' max_connections; more are answered 429
before anything is resolved), names looked up (the rules' max_lookups; more are answered 429 before the
lookup), and bytes (the rules' max_bytes, each lookup's estimate among them: once spent, every tunnel of the
run is cut and new requests are refused, while the run itself goes on). Every attempt ends in one
EgressEvent, which keeps a refusal's detail; the client reads only its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.egress_rules import EgressMode, IpAddress, listed, literal_address
from core.logging import get_logger
from runner.egress.client import answer_refusal, client_streams, detached
from runner.egress.records import EgressEvent, EgressRules, HostAsker, HostDecision, budget_reason, lookups_reason
from runner.egress.refusal import FORBIDDEN, TIMEOUT, TOO_MANY, Refused, answer
from runner.egress.request_head import HeadUnfinished, ProxyRequest, parse_head, read_head
from runner.egress.resolve import (
    LOOKUPS_PER_DOOR,
    RESOLVE_SECONDS,
    Resolver,
    SystemLookups,
    checked_addresses,
    lookup_bytes,
    request_check,
)
from runner.egress.tunnel import CONNECT_SECONDS, ByteBudget, Tunnel, connect

HEAD_SECONDS = 10.0  # for the whole request head: a client sending it a byte at a time is cut
MAX_OPENING = 32  # connections of one run still sending their head
BACKLOG = 128
SOCKET_MODE = 0o666  # the container's uid must connect; the channel folder's permissions guard who can reach it
MAX_UNIX_PATH_BYTES = 107  # sun_path holds 108 bytes including the terminating NUL
ACCEPT_RETRY_SECONDS = 0.1  # out of descriptors: the waiting connections stay queued until some are freed
ACCEPT_RETRY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
MAX_HOSTS_ASKED = 64  # distinct hosts one run's door asks the chat about (the run's questions are fewer anyway)
DOOR_CLOSED = "the run's door closed"


@dataclass(slots=True)
class _Attempt:
    """One connection from the container, from its accept to its event."""

    sock: socket.socket
    started_at: float
    host: str = ""
    port: int = 0
    address: str | None = None
    allowed: bool = False
    reason: str = ""
    lookups: int = 0  # 1 once the door looks its name up
    lookup_bytes: int = 0  # what that lookup took from the run's byte budget
    opening: bool = True  # holds one of the slots of connections still sending their head
    holding: bool = False  # holds one of the run's connection slots
    writer: asyncio.StreamWriter | None = None  # once set, the writer owns the socket
    tunnel: Tunnel | None = None
    reported: bool = False


class EgressDoor:
    """The HTTP forward proxy of one run, listening on `socket_path` from start() to close()."""

    def __init__(
        self,
        socket_path: Path,
        rules: EgressRules,
        *,
        on_event: Callable[[EgressEvent], None],
        resolver: Resolver | None = None,
        own_addresses: frozenset[IpAddress] = frozenset(),
        head_seconds: float = HEAD_SECONDS,
        resolve_seconds: float = RESOLVE_SECONDS,
        connect_seconds: float = CONNECT_SECONDS,
        max_opening: int = MAX_OPENING,
        asker: HostAsker | None = None,
    ) -> None:
        if rules.mode is EgressMode.NONE:
            raise ValueError("SUBAGENT_EGRESS=none opens no door")
        self._path = socket_path
        self._rules = rules
        self._on_event = on_event
        # Without a resolver of its caller's (RunDoors shares one pool among every door), a pool of its own.
        self._own_lookups: SystemLookups | None = None
        if resolver is None:
            self._own_lookups = SystemLookups(threads=LOOKUPS_PER_DOOR)
            resolver = self._own_lookups.for_door()
        self._resolver = resolver
        self._own = own_addresses
        self._head_seconds = head_seconds
        self._resolve_seconds = resolve_seconds
        self._connect_seconds = connect_seconds
        self._max_opening = max_opening
        self._asker = asker  # SUBAGENT_EGRESS=ask: the chat decides about an unlisted public host
        self._decisions: dict[tuple[str, int], asyncio.Task[HostDecision]] = {}
        self._budget = ByteBudget(rules.max_bytes)
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._attempts: dict[asyncio.Task[None], _Attempt] = {}
        self._opening = 0
        self._holding = 0
        self._lookups = 0
        self._closed = False
        self._log = get_logger(__name__)

    @property
    def bytes_used(self) -> int:
        return self._budget.used

    @property
    def lookups_made(self) -> int:
        return self._lookups

    async def start(self) -> None:
        """Listen on the socket (a stale one from an earlier bot process is replaced). The socket's folder
        must be the host's alone: the container mounts it read-only."""
        if self._listener is not None or self._closed:
            raise RuntimeError("a door starts once")
        if len(os.fsencode(self._path)) > MAX_UNIX_PATH_BYTES:
            raise ValueError(
                f"egress socket path is {len(os.fsencode(self._path))} bytes, over the {MAX_UNIX_PATH_BYTES}-byte "
                f"limit of Unix sockets: {self._path} (use a shorter DATA_DIR)"
            )
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.setblocking(False)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.lstat(self._path).st_mode):
                    os.unlink(self._path)
            listener.bind(str(self._path))
            os.chmod(self._path, SOCKET_MODE)
            listener.listen(BACKLOG)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept_loop(listener))

    async def close(self) -> None:
        """Stop listening, cut every tunnel, end every connection (each reports its event), remove the socket."""
        if self._closed:
            return
        self._closed = True
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
        tasks = list(self._attempts)
        for task, attempt in list(self._attempts.items()):
            if attempt.tunnel is not None:
                attempt.tunnel.cut(DOOR_CLOSED)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for decision in self._decisions.values():
            decision.cancel()
        await asyncio.gather(*self._decisions.values(), return_exceptions=True)
        if self._own_lookups is not None:
            self._own_lookups.close()

    # -- accepting -----------------------------------------------------------------------------------

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno not in ACCEPT_RETRY_ERRNOS:
                    self._log.error("egress_accept_failed", socket=str(self._path), error=str(exc))
                    return
                self._log.warning("egress_accept_paused", socket=str(self._path), error=str(exc))
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            self._admit(conn)
            # An accept that finds a connection waiting does not yield: a flood must take turns with the rest.
            await asyncio.sleep(0)

    def _admit(self, conn: socket.socket) -> None:
        attempt = _Attempt(sock=conn, started_at=time.time())
        if self._opening >= self._max_opening:
            # Turned away unread, at the cost of one send: a flood of connections holds no descriptors.
            attempt.reason = f"over {self._max_opening} connections of this run are still sending their request head"
            with contextlib.suppress(OSError):
                conn.send(answer(TOO_MANY, attempt.reason))
            conn.close()
            self._report(attempt)
            return
        self._opening += 1
        task = asyncio.create_task(self._serve(attempt))
        self._attempts[task] = attempt
        task.add_done_callback(self._served)

    def _served(self, task: asyncio.Task[None]) -> None:
        attempt = self._attempts.pop(task)
        self._release(attempt)
        if attempt.writer is None:  # cancelled before its streams were made: the socket is still ours
            attempt.sock.close()
        if not attempt.reported:
            attempt.reason = attempt.reason or DOOR_CLOSED
            self._report(attempt)

    def _leave_opening(self, attempt: _Attempt) -> None:
        if attempt.opening:
            attempt.opening = False
            self._opening -= 1

    def _release(self, attempt: _Attempt) -> None:
        self._leave_opening(attempt)
        if attempt.holding:
            attempt.holding = False
            self._holding -= 1

    # -- one connection ------------------------------------------------------------------------------

    async def _serve(self, attempt: _Attempt) -> None:
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        client: socket.socket | None = None  # the client's socket once its stream is done with (for the tunnel)
        server: socket.socket | None = None
        try:
            reader, writer = await client_streams(attempt.sock)
            attempt.writer = writer  # it owns the socket now
            request = await self._request(reader)
            attempt.host, attempt.port = request.host, request.port
            self._take_slot(attempt, request)
            self._count_lookup(attempt, request.host)
            addresses = await checked_addresses(
                self._rules,
                request.host,
                request.port,
                resolver=self._resolver,
                own=self._own,
                seconds=self._resolve_seconds,
            )
            if self._rules.mode is EgressMode.ASK and not self._listed(request.host, request.port):
                # Held (its slot too) while the chat decides; then connected only to the addresses checked above.
                await self._decided(request.host, request.port)
            address, server = await connect(addresses, request.port, seconds=self._connect_seconds)
            attempt.address = str(address)
            if self._budget.spent:  # spent by another tunnel while this one connected
                raise Refused(FORBIDDEN, budget_reason(self._rules.max_bytes))
            try:
                client, sent_early = await detached(reader, writer)
            except OSError as exc:  # the client went away meanwhile, or no descriptor was left for its socket
                attempt.reason = f"the client's connection could not be carried ({exc.strerror or type(exc).__name__})"
                return
            tunnel = Tunnel(client, server, self._budget, self._spent)
            attempt.tunnel, attempt.allowed = tunnel, True
            if request.connect:
                with contextlib.suppress(OSError):  # a client gone already: the tunnel sees it and ends
                    await asyncio.get_running_loop().sock_sendall(client, ESTABLISHED)
            await tunnel.run(request.head + sent_early)
            attempt.reason = f"cut: {tunnel.cut_reason}" if tunnel.cut_reason else ""
        except Refused as refused:
            attempt.reason = refused.detail  # the operator's; the client is answered the reason only
            if reader is not None and writer is not None:
                await answer_refusal(reader, writer, refused)
        except HeadUnfinished as unfinished:
            attempt.reason = str(unfinished)
        except asyncio.CancelledError:
            tunnel_reason = attempt.tunnel.cut_reason if attempt.tunnel is not None else None
            attempt.reason = f"cut: {tunnel_reason}" if tunnel_reason else DOOR_CLOSED
            raise
        except Exception as exc:  # a bug here must not stop the door serving the run's other connections
            self._log.exception("egress_connection_failed", socket=str(self._path))
            attempt.reason = f"the door failed on this connection ({type(exc).__name__})"
        finally:
            for sock in (server, client):  # a tunnel closes both when it ends; these are for one never run
                if sock is not None:
                    sock.close()
            if writer is not None:
                writer.close()
            self._release(attempt)
            self._report(attempt)

    async def _request(self, reader: asyncio.StreamReader) -> ProxyRequest:
        try:
            async with asyncio.timeout(self._head_seconds):
                raw = await read_head(reader)
        except TimeoutError as exc:
            raise Refused(TIMEOUT, f"the request head did not arrive within {self._head_seconds:g} s") from exc
        return parse_head(raw)

    def _take_slot(self, attempt: _Attempt, request: ProxyRequest) -> None:
        """Refused unless the budget, the rules and the connection cap all let this request through."""
        if self._budget.spent:
            raise Refused(FORBIDDEN, budget_reason(self._rules.max_bytes))
        request_check(self._rules, request.host, request.port)
        if self._holding >= self._rules.max_connections:
            raise Refused(
                TOO_MANY,
                f"this run holds its SUBAGENT_EGRESS_MAX_CONNECTIONS ({self._rules.max_connections}) connections",
            )
        self._holding += 1
        attempt.holding = True
        self._leave_opening(attempt)  # a refused one keeps its opening slot while its answer is handed over

    def _count_lookup(self, attempt: _Attempt, host: str) -> None:
        """A name is about to be looked up: refused (429) past the run's cap, else counted, its estimate taken
        from the byte budget (a lookup that spends it is not made). A literal address is no lookup."""
        if literal_address(host) is not None:
            return
        if self._lookups >= self._rules.max_lookups:
            raise Refused(TOO_MANY, lookups_reason(self._rules.max_lookups))
        attempt.lookup_bytes = self._budget.take(lookup_bytes(host))
        if self._budget.spent:
            self._spent()
            raise Refused(FORBIDDEN, budget_reason(self._rules.max_bytes))
        self._lookups += 1
        attempt.lookups = 1

    def _listed(self, host: str, port: int) -> bool:
        """In ask mode: on the operator's list or the chat's own, so no question (the address check came first)."""
        return listed(self._rules.allow, host, port) or listed(self._rules.chat_allow, host, port)

    async def _decided(self, host: str, port: int) -> None:
        """An unlisted public host in ask mode: refused unless the chat allows it. Asked once per host and port
        in this run: connections meanwhile wait for the same answer, later ones reuse it."""
        key = (host.lower().rstrip("."), port)
        decision = self._decisions.get(key)
        if decision is None:
            if self._asker is None or len(self._decisions) >= MAX_HOSTS_ASKED:
                raise Refused(FORBIDDEN, f"{host[:80]}:{port} is not on the list, and no more hosts are asked about")
            decision = asyncio.create_task(self._asker(*key), name=f"egress-ask-{key[0][:40]}")
            self._decisions[key] = decision
        try:
            decided = await asyncio.shield(decision)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the asker failed: nobody allowed it
            self._log.warning("egress_ask_failed", socket=str(self._path), error=str(exc))
            decided = HostDecision.DENY
        if decided is HostDecision.DENY:
            raise Refused(FORBIDDEN, f"{host[:80]}:{port} was not allowed by the chat (denied, or no answer)")

    def _spent(self) -> None:
        """The budget is spent: every tunnel of the run is cut (each one's event says why)."""
        reason = budget_reason(self._rules.max_bytes)
        cut = 0
        for attempt in self._attempts.values():
            if attempt.tunnel is not None and attempt.tunnel.cut_reason is None:
                attempt.tunnel.cut(reason)
                cut += 1
        self._log.info("egress_budget_spent", socket=str(self._path), bytes=self._budget.used, cut=cut)

    def _report(self, attempt: _Attempt) -> None:
        if attempt.reported:
            return
        attempt.reported = True
        tunnel = attempt.tunnel
        event = EgressEvent(
            host=attempt.host,
            port=attempt.port,
            address=attempt.address,
            allowed=attempt.allowed,
            reason=attempt.reason,
            bytes_up=attempt.lookup_bytes + (tunnel.bytes_up if tunnel is not None else 0),
            bytes_down=tunnel.bytes_down if tunnel is not None else 0,
            started_at=attempt.started_at,
            ended_at=time.time(),
            lookups=attempt.lookups,
        )
        try:
            self._on_event(event)
        except Exception:  # the recorder's failure is not the connection's
            self._log.exception("egress_event_failed", socket=str(self._path))
