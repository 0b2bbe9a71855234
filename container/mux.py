"""Many connections over one byte stream: the bridged run channel's frames, and the engine at both of its ends.

The pod's bridge (container/bridge.py) carries each connection the agent makes as a *stream* over its stdin and
stdout; the host's end (runner/kube/pod_bridge.py) connects each stream to the run's real socket. A frame is a
header `!BII` (type, stream id, payload length) and at most MAX_FRAME_PAYLOAD_BYTES of payload. Only the pod
opens streams, with ids that only grow. Each direction of a stream has a credit window: a receiver returns
credit (WINDOW) only once it has written the bytes to its local socket, so a stalled reader stalls its own
stream and nothing else, and a stream never holds more than its window. The receiving loop never awaits a local
socket (each stream has its own writer task). The host treats the pod as hostile: a frame that breaks the
protocol raises MuxError and ends the whole mux.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from enum import Enum

from container.mux_frames import (
    CREDIT,
    MAX_FRAME_PAYLOAD_BYTES,
    MAX_TARGET_BYTES,
    Frame,
    FrameType,
    MuxError,
    encode_frame,
    read_frame,
)

INITIAL_WINDOW_BYTES = 1024 * 1024  # per stream and direction: what one stream may hold in memory at each end
MAX_STREAMS = 32  # open at once; the pod side closes a connection past it, the host side ends the mux
# A frame the peer does not take within this long ends the session: a healthy peer always reads (its receiving
# loop never waits on a local socket), so only one that stopped reading its end blocks a send this long.
SEND_TIMEOUT_SECONDS = 60.0
CREDIT_BATCH_BYTES = 64 * 1024  # credit is returned at this size, or as soon as a stream's queue is empty
FRAMES_PER_YIELD = 64  # the receiving loop gives the event loop a turn this often, even on a flood of frames

LocalConnection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
# The host side's way to a target: a fresh local connection, or None when this run has no such target.
Connector = Callable[[str], Awaitable[LocalConnection | None]]
Sink = Callable[[bytes], Awaitable[None]]  # writes bytes to the peer, waiting while the transport is full


class Role(Enum):
    HOST = "host"
    POD = "pod"


class StreamState(Enum):
    OPEN = "open"
    SENT_EOF = "sent_eof"  # our direction has ended
    GOT_EOF = "got_eof"  # the peer's direction has ended
    CLOSED = "closed"  # both have ended: it no longer counts against the cap
    RESET = "reset"  # aborted by either side: late frames for it are dropped


@dataclass(eq=False, slots=True)
class _Stream:
    id: int
    target: str
    window_bytes: int
    state: StreamState = StreamState.OPEN
    inbound: deque[bytes] = field(default_factory=deque)
    inbound_ready: asyncio.Event = field(default_factory=asyncio.Event)
    receive_window: int = 0  # what the peer may still send us
    send_credit: int = 0  # what we may still send the peer
    credit_ready: asyncio.Event = field(default_factory=asyncio.Event)
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.receive_window = self.send_credit = self.window_bytes

    def ended(self, side: StreamState) -> None:
        """One direction has ended: ours (SENT_EOF) or the peer's (GOT_EOF)."""
        if self.state is StreamState.OPEN:
            self.state = side
        elif self.state in (StreamState.SENT_EOF, StreamState.GOT_EOF) and self.state is not side:
            self.state = StreamState.CLOSED

    @property
    def peer_done(self) -> bool:  # the peer sends no more on it
        return self.state in (StreamState.GOT_EOF, StreamState.CLOSED, StreamState.RESET)


class Mux:
    """One end of a multiplexed byte stream. `run()` carries frames until the stream ends; on the pod side each
    local connection is handed over with `open()`, on the host side `connect` gives each opened stream its own."""

    def __init__(
        self,
        role: Role,
        reader: asyncio.StreamReader,
        sink: Sink,
        *,
        connect: Connector | None = None,
        targets: Collection[str] = (),
        max_streams: int = MAX_STREAMS,
        window_bytes: int = INITIAL_WINDOW_BYTES,
        send_timeout_seconds: float = SEND_TIMEOUT_SECONDS,
    ) -> None:
        if role is Role.HOST and connect is None:
            raise ValueError("the host side needs a connector")
        self._role = role
        self._reader = reader
        self._sink = sink
        self._connect = connect
        self._targets = frozenset(targets)
        self._cap = max_streams
        # Streams whose tasks still run, closing ones too (a RESET waiting to be sent): past this the host ends the
        # mux, so a peer that opens and never reads cannot pile up tasks behind its unsent RESETs.
        self._live_cap = 2 * max_streams
        self._window_bytes = window_bytes
        self._send_timeout_seconds = send_timeout_seconds
        self._streams: dict[int, _Stream] = {}
        self._last_id = 0  # the highest stream id opened so far
        self._send_lock = asyncio.Lock()
        self._session = asyncio.Event()  # the pod side opens nothing before the host's HELLO (set at the end too)
        self._hellos = 0
        self._ended: asyncio.Future[None] | None = None
        self._closed = False

    @property
    def streams(self) -> int:
        """Streams whose tasks are still alive (closing ones included)."""
        return len(self._streams)

    async def wait_session(self) -> bool:
        """Pod side: wait for the host's first HELLO; False when the mux ended before any came."""
        await self._session.wait()
        return self._hellos > 0

    async def run(self) -> None:
        """Carry frames until the peer's stream ends (returns), the peer breaks the protocol (MuxError) or sending
        fails (OSError). Every stream is closed before it returns or raises."""
        if self._ended is not None:
            raise RuntimeError("a mux runs once")
        self._ended = asyncio.get_running_loop().create_future()
        receiving = asyncio.create_task(self._receive())
        try:
            if self._role is Role.HOST:
                await self._send(FrameType.HELLO, 0)
            await self._ended
        finally:
            receiving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await receiving
            await self.close()
            if not self._ended.cancelled():
                self._ended.exception()  # raised here already when the HELLO failed: retrieved, not reported twice

    async def open(self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Pod side: carry one accepted local connection to `target` until either end closes it. Past the cap,
        or once the mux has ended, the connection is closed at once."""
        if self._role is not Role.POD:
            raise RuntimeError("only the pod side opens streams")
        await self._session.wait()
        async with self._send_lock:  # checked here: connections accepted together queue for the lock
            if self._closed or len(self._streams) >= self._cap:
                _abort(writer)
                return
            self._last_id += 1
            stream = _Stream(self._last_id, target, self._window_bytes, writer=writer)
            self._streams[stream.id] = stream
            stream.task = asyncio.create_task(self._carry(stream, (reader, writer)))
            await self._write(encode_frame(FrameType.OPEN, stream.id, target.encode("ascii")))
        await asyncio.wait({stream.task})  # never raises: a dropped stream is not this caller's cancellation

    async def close(self) -> None:
        """End the mux from this side: every stream is closed; a running `run()` returns."""
        self._closed = True
        self._session.set()  # pod side: connections waiting for a session see the end and close
        if self._ended is not None:
            _settle(self._ended, None)
        await self._drop_all()

    async def _receive(self) -> None:
        assert self._ended is not None
        try:
            count = 0
            while (frame := await read_frame(self._reader)) is not None:
                if frame.type is FrameType.HELLO:
                    self._hello(frame)
                elif frame.type is FrameType.OPEN:
                    self._accept_open(frame)
                else:
                    self._stream_frame(frame)
                count += 1
                if count % FRAMES_PER_YIELD == 0:
                    await asyncio.sleep(0)  # a buffered flood is handled without holding the loop
        except Exception as exc:  # a MuxError, or the transport failed: the end, with its reason
            _settle(self._ended, exc)
        else:
            _settle(self._ended, None)

    def _hello(self, frame: Frame) -> None:
        if self._role is not Role.POD or frame.stream_id or frame.payload:
            raise MuxError("HELLO from the pod, or with a stream id or a payload")
        for stream in list(self._streams.values()):  # an earlier session's: the new host knows none of them
            self._abort_stream(stream)
        self._hellos += 1
        self._session.set()

    def _accept_open(self, frame: Frame) -> None:
        if self._role is not Role.HOST:
            raise MuxError("OPEN from the host")
        if frame.stream_id <= self._last_id:
            raise MuxError(f"OPEN of stream {frame.stream_id}, not above {self._last_id}")
        target = frame.payload.decode("ascii", errors="replace")
        if not frame.payload.isascii() or target not in self._targets:
            raise MuxError(f"OPEN of an unknown target {target[:MAX_TARGET_BYTES]!r}")
        if len(self._streams) >= self._live_cap:  # bounds the sum below too
            raise MuxError(f"OPEN while {len(self._streams)} streams are still closing or open")
        if sum(s.state not in (StreamState.CLOSED, StreamState.RESET) for s in self._streams.values()) >= self._cap:
            raise MuxError(f"OPEN past the cap of {self._cap} streams")
        self._last_id = frame.stream_id
        stream = _Stream(frame.stream_id, target, self._window_bytes)
        self._streams[stream.id] = stream
        stream.task = asyncio.create_task(self._carry(stream, None))

    def _stream_frame(self, frame: Frame) -> None:
        if frame.stream_id == 0 or frame.stream_id > self._last_id:
            raise MuxError(f"{frame.type.name} for stream {frame.stream_id}, which was never opened")
        stream = self._streams.get(frame.stream_id)
        if stream is None or stream.state is StreamState.RESET:
            return  # a stream that has ended: frames sent before the peer learnt so are dropped
        kind = frame.type
        if kind is FrameType.DATA:
            if stream.peer_done:
                raise MuxError(f"DATA on stream {stream.id} after its EOF")
            if not frame.payload or len(frame.payload) > stream.receive_window:
                size, window = len(frame.payload), stream.receive_window
                raise MuxError(f"DATA of {size} bytes on stream {stream.id}, past its window of {window}")
            stream.receive_window -= len(frame.payload)
            stream.inbound.append(frame.payload)
            stream.inbound_ready.set()
        elif kind is FrameType.WINDOW:
            if len(frame.payload) != CREDIT.size:
                raise MuxError(f"WINDOW with a payload of {len(frame.payload)} bytes")
            (increment,) = CREDIT.unpack(frame.payload)
            if increment == 0 or stream.send_credit + increment > stream.window_bytes:
                raise MuxError(f"WINDOW of {increment} on stream {stream.id}: more credit than was sent")
            stream.send_credit += increment
            stream.credit_ready.set()
        elif kind is FrameType.EOF:
            if frame.payload or stream.peer_done:
                raise MuxError(f"EOF on stream {stream.id} twice or with a payload")
            stream.ended(StreamState.GOT_EOF)
            stream.inbound_ready.set()
        elif frame.payload:  # RESET
            raise MuxError(f"RESET on stream {stream.id} with a payload")
        else:
            self._abort_stream(stream)

    async def _carry(self, stream: _Stream, local: LocalConnection | None) -> None:
        """Both directions of one stream until both have ended; a local failure resets it."""
        try:
            if local is None:  # the host side connects to its target first
                assert self._connect is not None
                try:
                    local = await self._connect(stream.target)
                except Exception:  # refused, timed out, or any failure of the connector: a reset
                    local = None
                if local is None:
                    await self._reset(stream)
                    return
                stream.writer = local[1]
            reader, writer = local
            up = asyncio.create_task(self._up(stream, reader))
            down = asyncio.create_task(self._down(stream, writer))
            try:
                await asyncio.wait((up, down), return_when=asyncio.FIRST_EXCEPTION)
                if any(not t.done() or t.exception() is not None for t in (up, down)):
                    await self._reset(stream)  # a local socket failed (or the mux's transport did)
            finally:
                for task in (up, down):
                    task.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        finally:
            if stream.writer is not None:
                if stream.state is StreamState.RESET:
                    _abort(stream.writer)
                else:
                    stream.writer.close()
            if self._streams.get(stream.id) is stream:
                del self._streams[stream.id]

    async def _up(self, stream: _Stream, reader: asyncio.StreamReader) -> None:
        """Local bytes to the peer, as far as the credit goes; the local end's EOF becomes an EOF frame."""
        while data := await reader.read(MAX_FRAME_PAYLOAD_BYTES):
            while data:
                while stream.send_credit == 0:
                    stream.credit_ready.clear()
                    await stream.credit_ready.wait()
                size = min(stream.send_credit, len(data))
                stream.send_credit -= size
                chunk, data = (data, b"") if size == len(data) else (data[:size], data[size:])  # whole: no copy
                await self._send(FrameType.DATA, stream.id, chunk)
        stream.ended(StreamState.SENT_EOF)  # before the frame: the peer may answer with an OPEN at once
        await self._send(FrameType.EOF, stream.id)

    async def _down(self, stream: _Stream, writer: asyncio.StreamWriter) -> None:
        """The peer's bytes to the local socket (the stream's only writer); credit goes back once written."""
        written = 0
        while True:
            if stream.inbound:
                chunk = stream.inbound.popleft()
                writer.write(chunk)
                await writer.drain()
                written += len(chunk)
                if written >= CREDIT_BATCH_BYTES or not stream.inbound:
                    if not stream.peer_done:  # else it sends no more: credit would be noise
                        stream.receive_window += written
                        await self._send(FrameType.WINDOW, stream.id, CREDIT.pack(written))
                    written = 0
                continue
            if stream.peer_done:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            stream.inbound_ready.clear()
            await stream.inbound_ready.wait()

    async def _reset(self, stream: _Stream) -> None:
        """Abort a stream from this side and tell the peer."""
        if stream.state is not StreamState.RESET and not self._closed:
            stream.state = StreamState.RESET
            with contextlib.suppress(OSError):
                await self._send(FrameType.RESET, stream.id)

    def _abort_stream(self, stream: _Stream) -> None:
        """The peer reset the stream (or a new session dropped it): end its task and its local connection."""
        stream.state = StreamState.RESET
        if stream.task is not None:
            stream.task.cancel()
        if stream.writer is not None:
            _abort(stream.writer)

    async def _drop_all(self) -> None:
        streams = list(self._streams.values())
        for stream in streams:
            self._abort_stream(stream)
        await asyncio.gather(*(s.task for s in streams if s.task is not None), return_exceptions=True)
        for stream in streams:  # a task cancelled before it ran never reached its own removal
            if self._streams.get(stream.id) is stream:
                del self._streams[stream.id]

    async def _send(self, frame_type: FrameType, stream_id: int, payload: bytes = b"") -> None:
        async with self._send_lock:
            await self._write(encode_frame(frame_type, stream_id, payload))

    async def _write(self, data: bytes) -> None:
        """Under the send lock: a frame goes out whole. A transport that fails (OSError) ends the mux."""
        if self._closed:
            raise ConnectionError("the mux has ended")
        try:
            async with asyncio.timeout(self._send_timeout_seconds):
                await self._sink(data)
        except Exception as exc:  # whatever the transport raised, or a peer that stopped reading: the mux ends
            self._closed = True
            if isinstance(exc, TimeoutError):  # an OSError too, but not the transport's
                error: OSError = ConnectionError(f"the peer took no frame for {self._send_timeout_seconds:g} s")
            else:
                error = exc if isinstance(exc, OSError) else ConnectionError(f"the transport failed: {exc!r}")
            if self._ended is not None:
                _settle(self._ended, error)
            raise error from None


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if not future.done():
        future.set_result(None) if error is None else future.set_exception(error)


def _abort(writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()  # at once, unsent bytes dropped
