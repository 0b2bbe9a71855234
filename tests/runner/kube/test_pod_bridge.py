"""The whole bridged channel without a cluster: the real bridge process (`python -m container.bridge`) over pipes
to a real PodBridge, which connects each stream to a real aiohttp server on the host's run socket (and an echo
server on the door's). HTTP through it, 20 MB each way, many streams at once, a stalled reader beside a flowing
one, a half-close, the host's end, a new session after the pod's stream broke, and pods that misbehave."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from container.bridge import EXIT_OK
from container.contract import BRIDGE_TARGET_EGRESS, BRIDGE_TARGET_RUN, EGRESS_SOCKET_FILE
from container.mux import MAX_STREAMS
from container.mux_frames import HEADER, FrameType, encode_frame
from container.protocol import CHANNEL_SOCKET_FILE
from runner.channel.capped_site import CappedUnixSite
from runner.kube.pod_bridge import BridgeState, ByteStream, PodBridge
from tests.container.bridge_helpers import BridgeProcess, echo, read_all, unix_server

WAIT_SECONDS = 60.0
BIG_BYTES = 20 * 1024 * 1024
CHUNK_BYTES = 256 * 1024
FAST_RETRY_SECONDS = (0.05,)


def host_app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    async def echo_body(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        async for chunk in request.content.iter_chunked(CHUNK_BYTES):
            await response.write(chunk)
        await response.write_eof()
        return response

    async def some_bytes(request: web.Request) -> web.StreamResponse:
        size = int(request.match_info["size"])
        response = web.StreamResponse(headers={"Content-Length": str(size)})
        await response.prepare(request)
        for start in range(0, size, CHUNK_BYTES):
            await response.write(b"b" * min(CHUNK_BYTES, size - start))
        await response.write_eof()
        return response

    app = web.Application(client_max_size=2 * BIG_BYTES)
    app.router.add_get("/hello", hello)
    app.router.add_post("/echo", echo_body)
    app.router.add_get("/bytes/{size}", some_bytes)
    return app


@dataclass
class Rig:
    pod_dir: Path
    host_dir: Path
    processes: list[BridgeProcess] = field(default_factory=list)
    bridge: PodBridge | None = None
    task: asyncio.Task[None] | None = None

    async def open_process(self) -> ByteStream:
        process = await BridgeProcess.start(self.pod_dir, egress=True)
        self.processes.append(process)
        return process

    def start(self, sockets: dict[str, Path | None]) -> PodBridge:
        self.bridge = PodBridge("run-1", self.open_process, sockets, retry_delays_seconds=FAST_RETRY_SECONDS)
        self.task = asyncio.create_task(self.bridge.run())
        return self.bridge

    async def listening(self, session: int) -> None:
        """Wait until bridge process number `session` (from 1) listens."""
        assert self.bridge is not None
        async with asyncio.timeout(WAIT_SECONDS):
            await self.bridge.wait_for(lambda b: b.sessions >= session)
        await self.processes[session - 1].wait_listening()

    def client(self) -> aiohttp.ClientSession:
        """The agent's side: HTTP to the pod's run socket."""
        connector = aiohttp.UnixConnector(path=os.fspath(self.pod_dir / CHANNEL_SOCKET_FILE), limit=MAX_STREAMS)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=WAIT_SECONDS))

    async def connect(self, file_name: str = CHANNEL_SOCKET_FILE) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(os.fspath(self.pod_dir / file_name))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    """A host with its run socket (aiohttp) and door (an echo server); the test starts the bridge."""
    rig = Rig(tmp_path / "pod", tmp_path / "host")
    rig.pod_dir.mkdir()
    rig.host_dir.mkdir()
    runner = web.AppRunner(host_app())
    await runner.setup()
    await CappedUnixSite(runner, os.fspath(rig.host_dir / CHANNEL_SOCKET_FILE), max_connections=2 * MAX_STREAMS).start()
    try:
        async with unix_server(rig.host_dir / EGRESS_SOCKET_FILE, echo):
            yield rig
            if rig.bridge is not None:
                await rig.bridge.close()
            if rig.task is not None:
                await rig.task  # run() has returned (and raised nothing)
            for process in rig.processes:
                await process.close()
    finally:
        await runner.cleanup()


@pytest.fixture
async def bridged(rig: Rig) -> Rig:
    rig.start(
        {BRIDGE_TARGET_RUN: rig.host_dir / CHANNEL_SOCKET_FILE, BRIDGE_TARGET_EGRESS: rig.host_dir / "egress.sock"}
    )
    await rig.listening(1)
    return rig


async def test_http_requests_pass_through(bridged: Rig) -> None:
    async with bridged.client() as client:
        for _ in range(3):
            async with client.get("http://run/hello") as response:
                assert (response.status, await response.text()) == (200, "hello")


async def test_twenty_megabytes_each_way(bridged: Rig) -> None:
    body = os.urandom(BIG_BYTES)
    async with bridged.client() as client, client.post("http://run/echo", data=body) as response:
        digest = hashlib.sha256()
        size = 0
        async for chunk in response.content.iter_chunked(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    assert (size, digest.digest()) == (len(body), hashlib.sha256(body).digest())


async def test_many_streams_at_once(bridged: Rig) -> None:
    bodies = [os.urandom(300 * 1024) for _ in range(MAX_STREAMS - 2)]

    async def one(client: aiohttp.ClientSession, body: bytes) -> bytes:
        async with client.post("http://run/echo", data=body) as response:
            return await response.read()

    connector = aiohttp.UnixConnector(path=os.fspath(bridged.pod_dir / CHANNEL_SOCKET_FILE), force_close=True)
    async with aiohttp.ClientSession(connector=connector) as client:
        answers = await asyncio.gather(*(one(client, body) for body in bodies))
    assert answers == bodies


async def test_a_stalled_reader_does_not_hold_up_the_others(bridged: Rig) -> None:
    reader, writer = await bridged.connect()
    writer.write(f"GET /bytes/{BIG_BYTES} HTTP/1.1\r\nHost: run\r\nConnection: close\r\n\r\n".encode())
    # Nobody reads this answer for now: its stream fills its window, then the host's socket, and waits.
    async with bridged.client() as client:
        for _ in range(20):
            async with client.get("http://run/hello") as response:
                assert await response.text() == "hello"
    async with asyncio.timeout(WAIT_SECONDS):
        answer = await read_all(reader)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and len(body) == BIG_BYTES
    writer.close()


async def test_a_half_close_passes_through(bridged: Rig) -> None:
    reader, writer = await bridged.connect(EGRESS_SOCKET_FILE)
    writer.write(b"CONNECT example.org:443 HTTP/1.1\r\n\r\n")
    writer.write_eof()  # the door's echo still answers all of it, then ends its side
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b"CONNECT example.org:443 HTTP/1.1\r\n\r\n"
    writer.close()


async def test_a_target_the_run_does_not_have_is_refused(rig: Rig) -> None:
    rig.start({BRIDGE_TARGET_RUN: rig.host_dir / CHANNEL_SOCKET_FILE, BRIDGE_TARGET_EGRESS: None})
    await rig.listening(1)
    reader, writer = await rig.connect(EGRESS_SOCKET_FILE)
    writer.write(b"GET http://example.org/ HTTP/1.1\r\n\r\n")
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b""  # reset: closed, nothing said
    writer.close()
    async with rig.client() as client, client.get("http://run/hello") as response:
        assert response.status == 200  # the run socket is still served


async def test_a_claimed_members_streams_go_to_the_renamed_folders_sockets(rig: Rig, tmp_path: Path) -> None:
    """A pool member's bridge points at the member's folder, where the pool listens; a claim renames the folder to
    the run's and repoints the bridge: the idle agent's waiting request is answered, and a new connection reaches
    the renamed folder's socket."""
    member_dir, run_dir = tmp_path / ".pool.member", tmp_path / "run-abcdef"
    member_dir.mkdir()
    accepted, claimed = asyncio.Event(), asyncio.Event()

    async def channel_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        accepted.set()
        await claimed.wait()  # the pool answers nothing until a run has the member
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\ntask")
        await writer.drain()
        writer.close()

    async with unix_server(member_dir / CHANNEL_SOCKET_FILE, channel_server):
        bridge = rig.start({BRIDGE_TARGET_RUN: member_dir / CHANNEL_SOCKET_FILE, BRIDGE_TARGET_EGRESS: None})
        await rig.listening(1)
        reader, writer = await rig.connect()  # the idle agent's task request
        writer.write(b"GET /run/task HTTP/1.1\r\nHost: run\r\n\r\n")
        async with asyncio.timeout(WAIT_SECONDS):
            await accepted.wait()
        os.rename(member_dir, run_dir)  # the claim
        claimed.set()
        async with asyncio.timeout(WAIT_SECONDS):
            assert (await read_all(reader)).endswith(b"task")  # it went with the renamed folder
        writer.close()
        reader, writer = await rig.connect()
        writer.write(b"GET /run/task HTTP/1.1\r\nHost: run\r\n\r\n")
        async with asyncio.timeout(WAIT_SECONDS):
            assert await read_all(reader) == b""  # not repointed yet: the member's folder is gone, refused
        bridge.repoint({BRIDGE_TARGET_RUN: run_dir / CHANNEL_SOCKET_FILE, BRIDGE_TARGET_EGRESS: None})
        reader, writer = await rig.connect()
        writer.write(b"GET /run/task HTTP/1.1\r\nHost: run\r\n\r\n")
        async with asyncio.timeout(WAIT_SECONDS):
            assert (await read_all(reader)).endswith(b"task")
        assert bridge.sessions == 1  # the claim opened no exec
        os.rename(run_dir, member_dir)  # for the server's own clean-up


async def test_close_ends_the_bridge_and_every_connection(bridged: Rig) -> None:
    reader, writer = await bridged.connect()
    writer.write(b"GET /hello HTTP/1.1\r\nHost: run\r\n\r\n")  # keep-alive: the connection stays open
    async with asyncio.timeout(WAIT_SECONDS):
        assert b"hello" in await reader.readuntil(b"hello")
    assert bridged.bridge is not None
    await bridged.bridge.close()
    assert bridged.bridge.state is BridgeState.CLOSED and bridged.bridge.streams == 0
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b""
        assert await bridged.processes[0].process.wait() == EXIT_OK  # its stdin ended: the host went away
    writer.close()


async def test_a_broken_stream_is_opened_again_with_a_new_session(bridged: Rig) -> None:
    reader, writer = await bridged.connect()
    writer.write(b"GET /hello HTTP/1.1\r\nHost: run\r\n\r\n")
    async with asyncio.timeout(WAIT_SECONDS):
        await reader.readuntil(b"hello")
    bridged.processes[0].kill()  # the exec stream breaks
    await bridged.listening(2)  # a new process, a new HELLO
    async with asyncio.timeout(WAIT_SECONDS):
        assert await read_all(reader) == b""  # the old process's connections went with it
    writer.close()
    async with bridged.client() as client, client.get("http://run/hello") as response:
        assert await response.text() == "hello"


# -- pods that misbehave -------------------------------------------------------------------------------


class ScriptedStream:
    """A pod's byte stream that says what the test wrote and records what the host sends."""

    def __init__(self, data: bytes) -> None:
        self.reader = asyncio.StreamReader()
        self.reader.feed_data(data)
        self.sent = bytearray()
        self.closed = False

    async def write(self, data: bytes) -> None:
        self.sent.extend(data)

    async def close(self) -> None:
        self.closed = True

    def describe(self) -> str:
        return "scripted"


async def test_a_pod_that_breaks_the_protocol_is_cut_off_for_good(rig: Rig) -> None:
    streams: list[ScriptedStream] = []

    async def opener() -> ByteStream:
        stream = ScriptedStream(encode_frame(FrameType.OPEN, 1, b"run") + HEADER.pack(FrameType.DATA, 1, 0xFFFFFFFF))
        streams.append(stream)
        return stream

    bridge = PodBridge("run-1", opener, {BRIDGE_TARGET_RUN: rig.host_dir / CHANNEL_SOCKET_FILE})
    async with asyncio.timeout(WAIT_SECONDS):
        await bridge.run()  # returns: nothing the pod sends raises into the caller
    assert bridge.state is BridgeState.BROKEN
    assert len(streams) == 1 and streams[0].closed
    assert streams[0].sent.startswith(encode_frame(FrameType.HELLO, 0))
    await bridge.close()


async def test_openings_that_fail_are_bounded_per_minute(rig: Rig) -> None:
    attempts = 0

    async def opener() -> ByteStream:
        nonlocal attempts
        attempts += 1
        raise OSError("the pod is not running yet")

    bridge = PodBridge("run-1", opener, {BRIDGE_TARGET_RUN: None}, retry_delays_seconds=(0.0,), max_opens_per_minute=3)
    running = asyncio.create_task(bridge.run())
    async with asyncio.timeout(WAIT_SECONDS):
        await bridge.wait_for(lambda b: b.state is BridgeState.HELD)
    assert attempts == 3
    async with asyncio.timeout(WAIT_SECONDS):
        await bridge.close()  # cuts the minute's wait short
        await running
    assert bridge.state is BridgeState.CLOSED and attempts == 3


async def test_a_stream_that_ends_at_once_is_opened_again_after_a_pause(rig: Rig) -> None:
    streams: list[ScriptedStream] = []

    async def opener() -> ByteStream:
        stream = ScriptedStream(b"")
        stream.reader.feed_eof()  # the exec ended as soon as it started (the command was not found)
        streams.append(stream)
        return stream

    bridge = PodBridge("run-1", opener, {BRIDGE_TARGET_RUN: None}, retry_delays_seconds=(0.01,))
    running = asyncio.create_task(bridge.run())
    async with asyncio.timeout(WAIT_SECONDS):
        await bridge.wait_for(lambda b: b.sessions >= 3)
        await bridge.close()
        await running
    assert all(stream.closed for stream in streams)
