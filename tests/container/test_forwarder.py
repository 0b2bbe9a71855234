"""The loopback forwarder against fake doors on a Unix socket: bytes unchanged both ways, half-closes passed
on, a missing or refusing door answered at once, the connection cap, and nothing left open after close()."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.forwarder import LOOPBACK, NO_PROXY_VARIABLES, PROXY_VARIABLES, Forwarder, shell_environment
from container.protocol import EGRESS_SOCKET_FILE
from tests.container.fake_door import FakeDoor, count_after_end, echo, exchange, greet_first, hold

SAFETY_SECONDS = 30.0  # a bound on a hang, never a wait: each test awaits the events it expects
PAYLOAD_BYTES = 4 * 1024 * 1024


@pytest.fixture
def door_path(tmp_path: Path) -> Path:
    return tmp_path / EGRESS_SOCKET_FILE


@pytest.fixture
async def forwarder(door_path: Path) -> AsyncIterator[Forwarder]:
    async with Forwarder(door_path) as forwarder:
        yield forwarder


async def connect(forwarder: Forwarder) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(LOOPBACK, forwarder.port)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def send_and_end(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()
    writer.write_eof()


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    """All the client gets until the forwarder ends its sending (a reset counts as the end)."""
    try:
        async with asyncio.timeout(SAFETY_SECONDS):
            return await reader.read()
    except ConnectionResetError:
        return b""


def forwarder_tasks() -> list[asyncio.Task[object]]:
    names = ("Forwarder.", "SpliceRelay.")
    return [task for task in asyncio.all_tasks() if task.get_coro().__qualname__.startswith(names)]  # type: ignore[union-attr]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# --- bytes both ways --------------------------------------------------------------------------------


async def test_large_binary_bytes_go_both_ways_at_once_unchanged(forwarder: Forwarder, door_path: Path) -> None:
    payload = os.urandom(PAYLOAD_BYTES)
    async with FakeDoor(door_path, echo) as door:
        reader, writer = await connect(forwarder)
        sending = asyncio.create_task(send_and_end(writer, payload))
        echoed = await read_to_end(reader)
        await sending
        await close(writer)

    assert echoed == payload
    assert door.accepted == 1


async def test_the_door_and_the_client_send_different_bytes_at_the_same_time(
    forwarder: Forwarder, door_path: Path
) -> None:
    upload, download = os.urandom(PAYLOAD_BYTES), os.urandom(PAYLOAD_BYTES - 1)
    received: list[bytes] = []
    async with FakeDoor(door_path, exchange(download, received)) as door:
        reader, writer = await connect(forwarder)
        sending = asyncio.create_task(send_and_end(writer, upload))
        got = await read_to_end(reader)
        await sending
        await asyncio.wait_for(door.wait_handled(1), SAFETY_SECONDS)  # the door has read the upload to its end
        await close(writer)

    assert got == download
    assert received == [upload]


async def test_a_client_that_ends_its_sending_still_gets_the_answer(forwarder: Forwarder, door_path: Path) -> None:
    async with FakeDoor(door_path, count_after_end):
        reader, writer = await connect(forwarder)
        await send_and_end(writer, b"x" * 100_000)
        answer = await read_to_end(reader)
        await close(writer)

    assert answer == b"got 100000 bytes"


async def test_a_door_that_ends_its_sending_still_gets_the_clients_bytes(forwarder: Forwarder, door_path: Path) -> None:
    received: list[bytes] = []
    async with FakeDoor(door_path, greet_first(received)) as door:
        reader, writer = await connect(forwarder)
        assert await read_to_end(reader) == b"hello from the door"
        await send_and_end(writer, b"still talking")
        await asyncio.wait_for(door.wait_handled(1), SAFETY_SECONDS)  # the door read the client's bytes to its end
        await forwarder.settle()  # the door got the client's end, then closed: the connection is over
        await close(writer)

    assert received == [b"still talking"]
    assert door.accepted == 1


# --- a door that is not there -----------------------------------------------------------------------


@pytest.mark.parametrize("door_kind", ["missing", "refusing"])
async def test_a_door_not_reachable_is_answered_502_at_once(
    forwarder: Forwarder, door_path: Path, door_kind: str
) -> None:
    unlistening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if door_kind == "refusing":
            unlistening.bind(str(door_path))  # a socket file nobody listens on: connecting is refused
        reader, writer = await connect(forwarder)
        writer.write(b"GET http://example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n")
        await writer.drain()
        answer = await read_to_end(reader)
        await close(writer)
    finally:
        unlistening.close()

    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert f"Content-Length: {len(body)}".encode() in head
    reason = "no such file or directory" if door_kind == "missing" else "connection refused"
    assert body == f"crewbot: the web proxy of this run is not reachable ({reason})\n".encode()


# --- limits and the end -----------------------------------------------------------------------------


async def test_connections_past_the_cap_are_closed_at_once(door_path: Path) -> None:
    async with Forwarder(door_path, max_connections=2) as forwarder, FakeDoor(door_path, hold) as door:
        held = [await connect(forwarder) for _ in range(2)]
        await door.wait_accepted(2)
        assert forwarder.connections == 2

        reader, writer = await connect(forwarder)
        assert await read_to_end(reader) == b""  # closed unanswered, and the door never saw it
        await close(writer)
        assert door.accepted == 2

        for _, held_writer in held:
            held_writer.write_eof()
        await forwarder.settle()
        for _, held_writer in held:
            await close(held_writer)
        assert forwarder.connections == 0

        reader, writer = await connect(forwarder)  # a place is free again
        await door.wait_accepted(3)
        writer.write_eof()
        assert await read_to_end(reader) == b""
        await close(writer)


async def test_close_ends_every_connection_and_the_listener(door_path: Path) -> None:
    async with FakeDoor(door_path, hold) as door:
        fds_before = open_fds()
        forwarder = Forwarder(door_path)
        port = await forwarder.start()
        clients = [await connect(forwarder) for _ in range(3)]
        await door.wait_accepted(3)
        assert forwarder_tasks()

        await forwarder.close()

        for reader, writer in clients:
            assert await read_to_end(reader) == b""
            await close(writer)
        assert forwarder.connections == 0
        assert forwarder_tasks() == []
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(LOOPBACK, port)
        assert open_fds() == fds_before


async def test_it_listens_on_loopback_only(forwarder: Forwarder) -> None:
    assert forwarder.url == f"http://127.0.0.1:{forwarder.port}"
    assert forwarder.port > 0


# --- the commands' environment ----------------------------------------------------------------------


def test_with_a_proxy_every_proxy_variable_names_it_and_no_proxy_is_empty() -> None:
    base = {"PATH": "/usr/bin", "HTTP_PROXY": "http://stale:1", "no_proxy": "example.org", "NO_PROXY": "*"}

    env = shell_environment(base, "http://127.0.0.1:4321")

    assert env == {"PATH": "/usr/bin"} | dict.fromkeys(PROXY_VARIABLES, "http://127.0.0.1:4321") | dict.fromkeys(
        NO_PROXY_VARIABLES, ""
    )


def test_without_a_proxy_no_proxy_variable_is_set_and_no_proxy_stays() -> None:
    base = {"PATH": "/usr/bin", "https_proxy": "http://stale:1", "ALL_PROXY": "socks5://x:1", "NO_PROXY": "a.org"}

    assert shell_environment(base, None) == {"PATH": "/usr/bin", "NO_PROXY": "a.org"}
