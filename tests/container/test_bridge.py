"""The real bridge process (`python -m container.bridge`) driven by a hand-written host: it listens once the
HELLO has come, opens a stream per connection with ids that only grow, respects the host's credit, drops a
session's streams at a new HELLO, writes nothing but frames, and ends with its stdin."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.bridge import EXIT_OK, EXIT_PROTOCOL
from container.contract import BRIDGE_TARGET_EGRESS, BRIDGE_TARGET_RUN, EGRESS_SOCKET_FILE
from container.mux import INITIAL_WINDOW_BYTES
from container.mux_frames import CREDIT, Frame, FrameType, encode_frame, read_frame
from container.protocol import CHANNEL_SOCKET_FILE
from tests.container.bridge_helpers import BridgeProcess, read_all

WAIT_SECONDS = 60.0


class Host:
    """The host's end, frame by frame."""

    def __init__(self, bridge: BridgeProcess, channel: Path) -> None:
        self.bridge = bridge
        self.channel = channel

    async def send(self, kind: FrameType, stream_id: int = 0, payload: bytes = b"") -> None:
        await self.bridge.write(encode_frame(kind, stream_id, payload))

    async def frame(self) -> Frame | None:
        async with asyncio.timeout(WAIT_SECONDS):
            return await read_frame(self.bridge.reader)

    async def expect(self, kind: FrameType, stream_id: int, payload: bytes | None = None) -> Frame:
        frame = await self.frame()
        assert frame is not None, "the bridge's stdout ended"
        assert (frame.type, frame.stream_id) == (kind, stream_id), frame
        if payload is not None:
            assert frame.payload == payload
        return frame

    async def hello(self) -> None:
        await self.send(FrameType.HELLO)
        await self.bridge.wait_listening()

    async def connect(self, file_name: str = CHANNEL_SOCKET_FILE) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(os.fspath(self.channel / file_name))

    async def exit_code(self) -> int:
        async with asyncio.timeout(WAIT_SECONDS):
            return await self.bridge.process.wait()


async def start(tmp_path: Path, *, egress: bool = False) -> Host:
    channel = tmp_path / "channel"
    channel.mkdir(parents=True)
    return Host(await BridgeProcess.start(channel, egress=egress), channel)


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    started = await start(tmp_path)
    yield started
    await started.bridge.close()


async def test_a_connection_becomes_a_stream_both_ways(host: Host) -> None:
    await host.hello()
    reader, writer = await host.connect()
    writer.write(b"GET /run/task HTTP/1.1\r\n\r\n")
    await host.expect(FrameType.OPEN, 1, BRIDGE_TARGET_RUN.encode())
    await host.expect(FrameType.DATA, 1, b"GET /run/task HTTP/1.1\r\n\r\n")
    await host.send(FrameType.DATA, 1, b"HTTP/1.1 200 OK\r\n\r\n")
    window = await host.expect(FrameType.WINDOW, 1)  # credit back, once written to the connection
    assert CREDIT.unpack(window.payload) == (19,)
    await host.send(FrameType.EOF, 1)
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b"HTTP/1.1 200 OK\r\n\r\n"
    writer.close()
    await host.expect(FrameType.EOF, 1)
    second_reader, second = await host.connect()
    await host.expect(FrameType.OPEN, 2, BRIDGE_TARGET_RUN.encode())  # ids only grow
    await host.send(FrameType.RESET, 2)
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(second_reader) == b""  # the host's reset closes the connection
    second.close()


async def test_the_host_credit_bounds_what_it_sends(host: Host) -> None:
    await host.hello()
    _, writer = await host.connect()
    body = os.urandom(4 * INITIAL_WINDOW_BYTES)
    writer.write(body)
    writer.write_eof()
    await host.expect(FrameType.OPEN, 1)
    received = bytearray()
    allowed = INITIAL_WINDOW_BYTES
    while len(received) < len(body):
        frame = await host.expect(FrameType.DATA, 1)
        received += frame.payload
        assert len(received) <= allowed, "the bridge sent past the credit it was given"
        if len(received) == allowed:  # all its credit is spent: it can only wait for more
            await host.send(FrameType.WINDOW, 1, CREDIT.pack(64 * 1024))
            allowed += 64 * 1024
    assert bytes(received) == body
    await host.expect(FrameType.EOF, 1)
    writer.close()


async def test_a_new_hello_drops_the_streams_of_the_last_session(host: Host) -> None:
    await host.hello()
    reader, writer = await host.connect()
    await host.expect(FrameType.OPEN, 1)
    await host.send(FrameType.HELLO)  # a new host: it knows nothing of stream 1
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b""
    writer.close()
    reader, writer = await host.connect()
    await host.expect(FrameType.OPEN, 2)  # not 1 again: the old id may still be in flight
    writer.write(b"after")
    await host.expect(FrameType.DATA, 2, b"after")
    writer.close()


async def test_egress_is_a_second_target_only_when_asked(tmp_path: Path) -> None:
    host = await start(tmp_path, egress=True)
    try:
        await host.hello()
        _, writer = await host.connect(EGRESS_SOCKET_FILE)
        await host.expect(FrameType.OPEN, 1, BRIDGE_TARGET_EGRESS.encode())
        writer.close()
    finally:
        await host.bridge.close()
    plain = await start(tmp_path / "plain")
    try:
        await plain.hello()
        assert not (plain.channel / EGRESS_SOCKET_FILE).exists()
    finally:
        await plain.bridge.close()


async def test_a_stale_path_is_replaced(tmp_path: Path) -> None:
    channel = tmp_path / "channel"
    channel.mkdir()
    (channel / CHANNEL_SOCKET_FILE).write_text("left by an earlier bridge")
    host = Host(await BridgeProcess.start(channel), channel)
    try:
        await host.hello()
        _, writer = await host.connect()
        await host.expect(FrameType.OPEN, 1)
        writer.close()
    finally:
        await host.bridge.close()


async def test_the_end_of_stdin_ends_it_and_its_connections(host: Host) -> None:
    await host.hello()
    reader, writer = await host.connect()
    await host.expect(FrameType.OPEN, 1)
    assert host.bridge.process.stdin is not None
    host.bridge.process.stdin.close()
    assert await host.exit_code() == EXIT_OK
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b""
    writer.close()
    assert not (host.channel / CHANNEL_SOCKET_FILE).exists()  # its socket went with it
    assert await host.frame() is None  # stdout ended at a frame's boundary: nothing but frames on it


async def test_a_host_that_breaks_the_protocol_ends_it(host: Host) -> None:
    await host.hello()
    await host.bridge.write(b"\x63" + b"\x00" * 8)  # frame type 99
    assert await host.exit_code() == EXIT_PROTOCOL
    await host.bridge.close()
    assert any("broke the protocol" in line for line in host.bridge.stderr_lines)


async def test_without_a_hello_it_opens_nothing(host: Host) -> None:
    """Before the host says HELLO there is no session: it does not listen, and stdin's end still ends it."""
    assert host.bridge.process.stdin is not None
    host.bridge.process.stdin.close()
    assert await host.exit_code() == EXIT_OK
    assert not host.bridge.listening.is_set()
    assert not (host.channel / CHANNEL_SOCKET_FILE).exists()
