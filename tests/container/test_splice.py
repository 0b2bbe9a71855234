"""The splice relay between real sockets (loopback TCP on one side, a Unix socket on the other, as the forwarder and
the door use it): bytes unchanged both ways and counted exactly, half-closes passed on, a peer that stops reading
holds only what the kernel's buffers and one pipe take, cut and cancel end it at once, an allowance ends it at
its last byte, and the copy fallback where splice is refused."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from container.splice import PIPE_BYTES, UNIX_SEND_BYTES, RelayEnd, SpliceRelay
from runner.egress.tunnel import ByteBudget

SAFETY_SECONDS = 30.0  # a bound on a hang, never a wait
PAYLOAD_BYTES = 8 * 1024 * 1024
CHUNK_BYTES = 64 * 1024


@dataclass
class Rig:
    client: socket.socket  # the relay's near peer (TCP, like curl's connection to the forwarder)
    server: socket.socket  # the far peer (a Unix socket, like the door)
    near: socket.socket  # the relay's own sockets, closed by their owner once run() returns
    far: socket.socket
    relay: SpliceRelay
    running: asyncio.Task[RelayEnd]


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        outer = socket.create_connection(listener.getsockname())
        inner, _ = listener.accept()
    return outer, inner


@contextlib.asynccontextmanager
async def rig(
    budget: ByteBudget | None = None, spent: list[int] | None = None, forward_first: bytes = b""
) -> AsyncIterator[Rig]:
    client, near = tcp_pair()
    far, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for peer in (client, server):
        peer.setblocking(False)
    on_spent = None if spent is None else (lambda: spent.append(1))
    relay = SpliceRelay(near, far, allowance=budget, on_spent=on_spent)
    running = asyncio.create_task(relay.run(forward_first=forward_first))
    try:
        yield Rig(client, server, near, far, relay, running)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        for sock in (client, server, near, far):
            sock.close()


async def send_and_end(sock: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, data)
    sock.shutdown(socket.SHUT_WR)


async def read_to_end(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    async with asyncio.timeout(SAFETY_SECONDS):
        try:
            while chunk := await loop.sock_recv(sock, CHUNK_BYTES):
                got += chunk
        except ConnectionResetError:
            pass
    return bytes(got)


async def relay_threads() -> list[threading.Thread]:
    """Relay threads still alive, each given a moment to return (run() returns once they have left the sockets,
    which is the last thing they do)."""
    threads = [thread for thread in threading.enumerate() if thread.name == "splice-relay"]
    for thread in threads:
        await asyncio.to_thread(thread.join, SAFETY_SECONDS)
    return [thread for thread in threads if thread.is_alive()]


async def within(awaitable: asyncio.Task[RelayEnd]) -> RelayEnd:
    async with asyncio.timeout(SAFETY_SECONDS):
        return await awaitable


async def test_bytes_go_both_ways_at_once_unchanged_and_are_counted_exactly() -> None:
    up, down = os.urandom(PAYLOAD_BYTES), os.urandom(PAYLOAD_BYTES - 7)
    async with rig() as r:
        sending = [asyncio.create_task(send_and_end(r.client, up)), asyncio.create_task(send_and_end(r.server, down))]
        got_up, got_down = await asyncio.gather(read_to_end(r.server), read_to_end(r.client))
        await asyncio.gather(*sending)
        assert await within(r.running) is RelayEnd.DONE

    assert got_up == up and got_down == down
    assert (r.relay.bytes_forward, r.relay.bytes_back) == (len(up), len(down))
    assert await relay_threads() == []


async def test_a_half_close_passes_through_and_the_other_way_still_carries() -> None:
    loop = asyncio.get_running_loop()
    async with rig(forward_first=b"head:") as r:
        await send_and_end(r.client, b"request")
        assert await read_to_end(r.server) == b"head:request"  # its end reached the server, as an end
        await loop.sock_sendall(r.server, b"the answer after the request's end")
        r.server.shutdown(socket.SHUT_WR)
        assert await read_to_end(r.client) == b"the answer after the request's end"
        assert await within(r.running) is RelayEnd.DONE
    assert r.relay.bytes_forward == len(b"head:request")


async def test_a_peer_that_stops_reading_holds_only_the_buffers_and_one_pipe_and_cut_ends_it() -> None:
    loop = asyncio.get_running_loop()
    async with rig() as r:
        chunk = b"x" * CHUNK_BYTES

        async def flood() -> None:
            with contextlib.suppress(OSError):
                while True:
                    await loop.sock_sendall(r.client, chunk)

        flooding = asyncio.create_task(flood())
        # The server reads nothing: what the relay moved stops growing once the kernel's buffers and its pipe are full.
        moved = -1
        while moved != r.relay.bytes_forward:
            moved = r.relay.bytes_forward
            await asyncio.sleep(0.2)
        # A Unix socket's bytes in flight count against its sender's send buffer: the relay's own, raised.
        assert r.far.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * UNIX_SEND_BYTES
        buffers = [(r.server, socket.SO_RCVBUF), (r.server, socket.SO_SNDBUF), (r.far, socket.SO_SNDBUF)]
        bound = PIPE_BYTES + sum(sock.getsockopt(socket.SOL_SOCKET, option) for sock, option in buffers)
        assert 0 < moved <= bound
        assert not flooding.done()

        r.relay.cut()
        assert await within(r.running) is RelayEnd.CUT
        r.near.close()  # as the relay's owners do once it returns: bytes still unread, so the client is reset
        r.far.close()
        async with asyncio.timeout(SAFETY_SECONDS):
            await flooding
        assert await relay_threads() == []


async def test_cancelling_the_run_cuts_both_connections_and_leaves_no_thread() -> None:
    loop = asyncio.get_running_loop()
    async with rig() as r:
        await loop.sock_sendall(r.client, b"ping")
        assert await loop.sock_recv(r.server, 4) == b"ping"
        r.running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await r.running
        assert await relay_threads() == []  # run() returned only once its threads had left the sockets
        assert await read_to_end(r.client) == b""
        assert await read_to_end(r.server) == b""


async def test_an_allowance_ends_a_download_at_its_last_byte() -> None:
    limit = 3 * 1024 * 1024 + 17
    spent: list[int] = []
    budget = ByteBudget(limit)
    async with rig(budget, spent) as r:
        sending = asyncio.create_task(send_and_end(r.server, os.urandom(PAYLOAD_BYTES)))
        got = await read_to_end(r.client)
        assert await within(r.running) is RelayEnd.SPENT
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        await asyncio.sleep(0)  # on_spent is told on the loop

    assert len(got) == limit == budget.used == r.relay.bytes_back
    assert spent == [1]  # the owner was told once (the door cuts the run's other tunnels then)


async def test_an_allowance_counts_both_ways_together_and_nothing_passes_it() -> None:
    limit = 3 * 1024 * 1024 + 17
    budget = ByteBudget(limit)
    async with rig(budget, []) as r:
        sending = [
            asyncio.create_task(send_and_end(r.client, os.urandom(PAYLOAD_BYTES))),
            asyncio.create_task(send_and_end(r.server, os.urandom(PAYLOAD_BYTES))),
        ]
        got_up, got_down = await asyncio.gather(read_to_end(r.server), read_to_end(r.client))
        assert await within(r.running) is RelayEnd.SPENT
        for task in sending:
            task.cancel()
        await asyncio.gather(*sending, return_exceptions=True)

    assert r.relay.bytes_forward + r.relay.bytes_back == limit == budget.used
    # Counted when granted, as the door always counted: a chunk the cut interrupts is counted, not all delivered.
    assert len(got_up) <= r.relay.bytes_forward and len(got_down) <= r.relay.bytes_back


async def test_a_server_that_breaks_the_connection_ends_both_directions() -> None:
    loop = asyncio.get_running_loop()
    client, near = tcp_pair()
    far, server = tcp_pair()  # TCP on both sides: an abortive close is a reset
    client.setblocking(False)
    relay = SpliceRelay(near, far)
    running = asyncio.create_task(relay.run())
    try:
        await loop.sock_sendall(client, b"hello")
        server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        server.close()  # unread bytes and linger 0: a reset
        assert await within(running) is RelayEnd.BROKEN
        assert await read_to_end(client) == b""
    finally:
        for sock in (client, near, far, server):
            sock.close()


async def test_where_splice_is_refused_the_bytes_are_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "splice", refused)  # the kernel (or a sandbox) refuses it for these sockets
    up, down = os.urandom(PAYLOAD_BYTES), os.urandom(1000)
    budget = ByteBudget(10 * PAYLOAD_BYTES)
    async with rig(budget) as r:
        sending = [asyncio.create_task(send_and_end(r.client, up)), asyncio.create_task(send_and_end(r.server, down))]
        got_up, got_down = await asyncio.gather(read_to_end(r.server), read_to_end(r.client))
        await asyncio.gather(*sending)
        assert await within(r.running) is RelayEnd.DONE
    assert (got_up, got_down) == (up, down)
    assert budget.used == len(up) + len(down)


async def test_a_connection_that_gets_no_thread_is_ended_not_left_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the container's pids limit a thread cannot start: the connection ends (both peers see it), nothing hangs."""

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    async with rig() as r:
        assert await within(r.running) is RelayEnd.BROKEN
        assert await read_to_end(r.client) == b""
        assert await read_to_end(r.server) == b""
