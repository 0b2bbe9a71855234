"""The mux (container/mux.py) in one process: a pod side and a host side over a socket pair carry connections with
credit per stream; the host side, fed hand-written hostile frames, ends the whole mux at the first violation with
every stream and local connection closed and no task left behind."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from container.contract import BRIDGE_TARGET_EGRESS, BRIDGE_TARGET_RUN
from container.mux import INITIAL_WINDOW_BYTES, MAX_STREAMS, Connector, LocalConnection, Mux, Role
from container.mux_frames import (
    CREDIT,
    HEADER,
    MAX_FRAME_PAYLOAD_BYTES,
    Frame,
    FrameType,
    MuxError,
    encode_frame,
    read_frame,
)
from tests.container.bridge_helpers import HostSocket, counting_echo_server, read_all, sink_of, stream_pair

WAIT_SECONDS = 30.0
TARGETS = (BRIDGE_TARGET_RUN, BRIDGE_TARGET_EGRESS)


@pytest.fixture
async def host_socket(tmp_path: Path) -> AsyncIterator[HostSocket]:
    async with counting_echo_server(tmp_path / "host.sock") as state:
        yield state


@dataclass
class Pair:
    pod: Mux
    host: Mux
    runs: list[asyncio.Task[None]]
    wires: list[asyncio.StreamWriter]
    agents: list[asyncio.Task[None]] = field(default_factory=list)

    async def agent(self, target: str = BRIDGE_TARGET_RUN) -> LocalConnection:
        """A connection made to the pod side's socket: the test holds one end, the pod mux carries the other."""
        ours, theirs = await stream_pair()
        self.agents.append(asyncio.create_task(self.pod.open(target, *theirs)))
        return ours


@pytest.fixture
async def pair(host_socket: HostSocket) -> AsyncIterator[Pair]:
    (pod_r, pod_w), (host_r, host_w) = await stream_pair()
    pod = Mux(Role.POD, pod_r, sink_of(pod_w))
    host = Mux(Role.HOST, host_r, sink_of(host_w), connect=host_socket.connect, targets=TARGETS)
    runs = [asyncio.create_task(pod.run()), asyncio.create_task(host.run())]
    result = Pair(pod, host, runs, [pod_w, host_w])
    yield result
    await host.close()
    await pod.close()
    for writer in result.wires:
        writer.close()
    await asyncio.gather(*runs, *result.agents, return_exceptions=True)


async def test_a_connection_is_carried_both_ways_with_a_half_close(pair: Pair, host_socket: HostSocket) -> None:
    reader, writer = await pair.agent()
    body = os.urandom(3 * INITIAL_WINDOW_BYTES + 12_345)  # past the window: credit has to come back
    writer.write(body)
    writer.write_eof()  # half-close: the echo still answers, then ends its side
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == body
    writer.close()
    await host_socket.wait(lambda s: s.live == 0)
    async with asyncio.timeout(WAIT_SECONDS):
        await asyncio.gather(*pair.agents)
    assert pair.pod.streams == 0


async def test_a_stalled_stream_does_not_hold_up_another(pair: Pair, host_socket: HostSocket) -> None:
    stalled_reader, stalled_writer = await pair.agent()
    body = os.urandom(4 * INITIAL_WINDOW_BYTES)
    stalled_writer.write(body)  # the echo answers it all, but nobody reads the answer on this side
    # Let the stalled stream run into its window: the host has sent all the credit it had.
    await host_socket.wait(lambda s: s.accepted == 1)
    reader, writer = await pair.agent()
    for _ in range(20):
        writer.write(b"ping" * 1000)
        async with asyncio.timeout(WAIT_SECONDS):
            assert await reader.readexactly(4000) == b"ping" * 1000
    writer.close()
    stalled_writer.write_eof()
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(stalled_reader) == body
    stalled_writer.close()


async def test_an_absent_target_is_reset_and_the_connection_closed(pair: Pair) -> None:
    reader, writer = await pair.agent(BRIDGE_TARGET_EGRESS)  # the connector has no egress socket
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b""
        await asyncio.gather(*pair.agents)
    writer.close()
    reader, writer = await pair.agent()  # the mux goes on
    writer.write(b"still here")
    writer.write_eof()
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b"still here"
    writer.close()


async def test_a_closed_local_connection_resets_its_stream_only(pair: Pair, host_socket: HostSocket) -> None:
    _, first = await pair.agent()
    first.write(b"x")
    await host_socket.wait(lambda s: s.accepted == 1)
    first.transport.abort()
    await host_socket.wait(lambda s: s.live == 0)  # the host side's connection was closed with it
    reader, writer = await pair.agent()
    writer.write(b"y")
    writer.write_eof()
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b"y"
    writer.close()


async def test_past_the_cap_the_pod_side_closes_new_connections(pair: Pair, host_socket: HostSocket) -> None:
    host_socket.stall.clear()  # every connection stays open
    held = [await pair.agent() for _ in range(MAX_STREAMS)]
    await host_socket.wait(lambda s: s.accepted == MAX_STREAMS)
    reader, writer = await pair.agent()
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b""  # closed at once
    writer.close()
    for _, held_writer in held:
        held_writer.close()
    host_socket.stall.set()  # the echoes read their ends, and close
    await host_socket.wait(lambda s: s.live == 0)


# -- hostile frames at the host side -------------------------------------------------------------------


class Hostile:
    """A host side mux fed by the test's frames; what it sends is kept."""

    def __init__(self, connect: Connector) -> None:
        self.reader = asyncio.StreamReader()
        self.sent = bytearray()
        self.wrote = asyncio.Event()
        self.mux = Mux(Role.HOST, self.reader, self.sink, connect=connect, targets=TARGETS)

    async def sink(self, data: bytes) -> None:
        self.sent.extend(data)
        self.wrote.set()

    async def wait_sent(self, kind: FrameType) -> None:
        async with asyncio.timeout(WAIT_SECONDS):
            while kind not in [f.type for f in self.frames_sent()]:
                self.wrote.clear()
                await self.wrote.wait()

    def feed(self, *frames: bytes) -> None:
        self.reader.feed_data(b"".join(frames))

    def frames_sent(self) -> list[Frame]:
        frames, data = [], bytes(self.sent)
        while data:
            kind, stream_id, length = HEADER.unpack_from(data)
            frames.append(Frame(FrameType(kind), stream_id, data[HEADER.size : HEADER.size + length]))
            data = data[HEADER.size + length :]
        return frames


@pytest.fixture
def hostile(host_socket: HostSocket) -> Hostile:
    return Hostile(host_socket.connect)


def mux_tasks(tasks: set[asyncio.Task[object]]) -> set[asyncio.Task[object]]:
    return {task for task in tasks if task.get_coro().__qualname__.startswith("Mux.")}  # type: ignore[union-attr]


def frame(kind: FrameType | int, stream_id: int, payload: bytes = b"", length: int | None = None) -> bytes:
    return HEADER.pack(kind, stream_id, len(payload) if length is None else length) + payload


def opened(stream_id: int, target: bytes = BRIDGE_TARGET_RUN.encode()) -> bytes:
    return frame(FrameType.OPEN, stream_id, target)


DATA_PAST_WINDOW = [opened(1)] + [frame(FrameType.DATA, 1, b"z" * MAX_FRAME_PAYLOAD_BYTES)] * (
    INITIAL_WINDOW_BYTES // MAX_FRAME_PAYLOAD_BYTES + 1
)
VIOLATIONS = {
    "bad type": ([frame(99, 1)], "unknown frame type"),
    "oversize length": ([frame(FrameType.DATA, 1, length=MAX_FRAME_PAYLOAD_BYTES + 1)], "over"),
    "huge length": ([frame(FrameType.DATA, 1, length=0xFFFFFFFF)], "over"),
    "unknown stream": ([opened(1), frame(FrameType.DATA, 2, b"x")], "never opened"),
    "stream zero": ([frame(FrameType.EOF, 0)], "never opened"),
    "data past the window": (DATA_PAST_WINDOW, "past its window"),
    "empty data": ([opened(1), frame(FrameType.DATA, 1)], "DATA of 0 bytes"),
    "duplicate open": ([opened(1), opened(1)], "not above"),
    "old open": ([opened(2), opened(1)], "not above"),
    "unknown target": ([opened(1, b"docker.sock")], "unknown target"),
    "target not ascii": ([opened(1, b"\xff\xfe")], "unknown target"),
    "too many streams": ([opened(i) for i in range(1, MAX_STREAMS + 2)], "cap"),
    "hello from the pod": ([frame(FrameType.HELLO, 0)], "HELLO from the pod"),
    "credit never sent": ([opened(1), frame(FrameType.WINDOW, 1, CREDIT.pack(1))], "more credit"),
    "zero credit": ([opened(1), frame(FrameType.WINDOW, 1, CREDIT.pack(0))], "more credit"),
    "window of the wrong size": ([opened(1), frame(FrameType.WINDOW, 1, b"\x00\x01")], "payload of 2"),
    "eof twice": ([opened(1), frame(FrameType.EOF, 1), frame(FrameType.EOF, 1)], "twice"),
    "data after eof": ([opened(1), frame(FrameType.EOF, 1), frame(FrameType.DATA, 1, b"x")], "after its EOF"),
    "reset with a payload": ([opened(1), frame(FrameType.RESET, 1, b"x")], "with a payload"),
}


@pytest.mark.parametrize("name", list(VIOLATIONS))
async def test_a_violation_ends_the_mux_with_nothing_left(name: str, hostile: Hostile, host_socket: HostSocket) -> None:
    frames, message = VIOLATIONS[name]
    before = asyncio.all_tasks()
    hostile.feed(*frames)  # no EOF: only the violation can end it
    with pytest.raises(MuxError, match=message):
        async with asyncio.timeout(WAIT_SECONDS):
            await hostile.mux.run()
    assert hostile.mux.streams == 0
    assert host_socket.all_closed()
    assert mux_tasks(asyncio.all_tasks() - before) == set()
    assert hostile.frames_sent()[0].type is FrameType.HELLO


async def test_a_huge_length_is_refused_before_its_payload(hostile: Hostile) -> None:
    """The header alone ends it: nothing waits for (or allocates) four gigabytes."""
    hostile.feed(HEADER.pack(FrameType.DATA, 1, 0xFFFFFFFF))
    with pytest.raises(MuxError):
        async with asyncio.timeout(WAIT_SECONDS):
            await hostile.mux.run()


async def test_a_flood_keeps_the_loop_turning_and_memory_bounded(hostile: Hostile, host_socket: HostSocket) -> None:
    """Frames for a stream that was reset are dropped as they come (a peer may have sent them before it knew); a
    flood of them is read with the loop given a turn every few frames, then the data flood past the window ends it."""
    host_socket.stall.clear()  # the host connection reads nothing: no credit comes back from it
    ticks = 0
    running = True

    async def ticker() -> None:
        nonlocal ticks
        while running:
            ticks += 1
            await asyncio.sleep(0)

    flood_frames = 20_000
    hostile.feed(opened(1), frame(FrameType.RESET, 1), *[frame(FrameType.DATA, 1, b"x" * 16)] * flood_frames)
    past_window = INITIAL_WINDOW_BYTES // MAX_FRAME_PAYLOAD_BYTES + 1
    hostile.feed(opened(2), *[frame(FrameType.DATA, 2, b"z" * MAX_FRAME_PAYLOAD_BYTES)] * past_window)
    hostile.feed(*[frame(FrameType.DATA, 2, b"x")] * flood_frames)  # never read: the mux has ended before
    tick_task = asyncio.create_task(ticker())
    try:
        with pytest.raises(MuxError, match="past its window"):
            async with asyncio.timeout(WAIT_SECONDS):
                await hostile.mux.run()
    finally:
        running = False
        await tick_task
    assert ticks >= flood_frames // 64 // 2  # the loop was not held for the whole flood
    assert host_socket.all_closed()


async def test_a_truncated_frame_is_an_end_not_a_violation(hostile: Hostile) -> None:
    hostile.feed(opened(1), frame(FrameType.DATA, 1, b"abc")[:-1])
    hostile.reader.feed_eof()
    async with asyncio.timeout(WAIT_SECONDS):
        await hostile.mux.run()
    assert hostile.mux.streams == 0


async def test_late_frames_for_a_stream_the_host_reset_are_dropped(hostile: Hostile) -> None:
    """A stream to an absent target is reset by the host; what the pod sent before it learnt so is not hostile."""
    hostile.feed(opened(1, BRIDGE_TARGET_EGRESS.encode()), frame(FrameType.DATA, 1, b"early"))
    running = asyncio.create_task(hostile.mux.run())
    await hostile.wait_sent(FrameType.RESET)
    hostile.feed(frame(FrameType.DATA, 1, b"late"), frame(FrameType.EOF, 1))
    hostile.reader.feed_eof()
    async with asyncio.timeout(WAIT_SECONDS):
        await running
    assert [(f.type, f.stream_id) for f in hostile.frames_sent()] == [(FrameType.HELLO, 0), (FrameType.RESET, 1)]


async def test_read_frame_and_encode_frame_agree() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(encode_frame(FrameType.DATA, 7, b"abc") + encode_frame(FrameType.EOF, 7))
    reader.feed_eof()
    assert await read_frame(reader) == Frame(FrameType.DATA, 7, b"abc")
    assert await read_frame(reader) == Frame(FrameType.EOF, 7)
    assert await read_frame(reader) is None
    with pytest.raises(ValueError):
        encode_frame(FrameType.DATA, 1, b"x" * (MAX_FRAME_PAYLOAD_BYTES + 1))


async def test_a_transport_that_fails_ends_the_mux(host_socket: HostSocket) -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(opened(1) + frame(FrameType.DATA, 1, b"ping"))
    sent: list[bytes] = []

    async def breaking_sink(data: bytes) -> None:
        if sent:  # the HELLO goes out; the first answer (credit for the ping) finds the pipe broken
            raise BrokenPipeError("the exec stream is gone")
        sent.append(data)

    mux = Mux(Role.HOST, reader, breaking_sink, connect=host_socket.connect, targets=TARGETS)
    with pytest.raises(BrokenPipeError):
        async with asyncio.timeout(WAIT_SECONDS):
            await mux.run()
    assert mux.streams == 0 and host_socket.all_closed()


async def test_the_pod_side_opens_a_waiting_connection_once_the_hello_comes() -> None:
    (pod_r, pod_w), (host_r, host_w) = await stream_pair()
    pod = Mux(Role.POD, pod_r, sink_of(pod_w))
    running = asyncio.create_task(pod.run())
    ours, theirs = await stream_pair()
    opening = asyncio.create_task(pod.open(BRIDGE_TARGET_RUN, *theirs))
    host_w.write(encode_frame(FrameType.HELLO, 0))
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_frame(host_r) == Frame(FrameType.OPEN, 1, BRIDGE_TARGET_RUN.encode())  # only now
    host_w.close()  # the host goes away: the pod side ends, and the connection with it
    async with asyncio.timeout(WAIT_SECONDS):
        await running
        await opening
        assert await read_all(ours[0]) == b""
    ours[1].close()
    pod_w.close()
    assert await pod.wait_session()


async def test_a_peer_that_stops_reading_cannot_pile_up_streams(host_socket: HostSocket) -> None:
    """Review finding: the host's RESETs of refused streams waited on a transport the pod no longer read, and
    each further OPEN left one more task behind them. Now the live streams are capped and the mux ends."""
    reader = asyncio.StreamReader()
    sent: list[bytes] = []
    never = asyncio.Event()

    async def stalled_sink(data: bytes) -> None:
        if sent:  # the HELLO goes out, then the pod stops reading its stdin
            await never.wait()
        sent.append(data)

    async def refuse(target: str) -> LocalConnection | None:
        return None  # an absent target (egress off): every stream is reset

    mux = Mux(Role.HOST, reader, stalled_sink, connect=refuse, targets=TARGETS)
    # Two dead-id RESETs between OPENs keep the open ones under the cap of open streams, as the attack did.
    reader.feed_data(b"".join(opened(n) + frame(FrameType.RESET, 1) * 2 for n in range(1, 20_001)))
    with pytest.raises(MuxError, match="still closing"):
        async with asyncio.timeout(WAIT_SECONDS):
            await mux.run()
    assert mux.streams == 0


async def test_a_frame_the_peer_never_takes_ends_the_mux(host_socket: HostSocket) -> None:
    reader = asyncio.StreamReader()
    never = asyncio.Event()

    async def stalled_sink(data: bytes) -> None:
        await never.wait()

    mux = Mux(Role.HOST, reader, stalled_sink, connect=host_socket.connect, targets=TARGETS, send_timeout_seconds=0.2)
    with pytest.raises(ConnectionError, match="took no frame"):
        async with asyncio.timeout(WAIT_SECONDS):
            await mux.run()  # its HELLO is never taken
    assert mux.streams == 0
