"""The host's end of a pod's bridged run channel: one PodBridge per run.

The pod has no network and shares no folder with the host, so the host opens a byte stream into it (an exec of
`python -m container.bridge`, runner/kube/exec_stream.py), says HELLO, and runs the host side of the mux
(container/mux.py) over it: each stream the pod opens gets a fresh connection to the run's real socket on the
host (the run socket, or the door to the web when the run has one), the same sockets Docker would mount, so the
same handlers serve both backends. Everything that comes from the pod is hostile: a broken protocol ends the
bridge for good (logged); a stream that merely ends is opened again after a pause, a bounded number of times a
minute, for as long as the run lives. Nothing the pod sends raises into the caller.

A warm pool member's bridge is up before any run is: the exec is open, and the idle agent's task request waits
on the member's run socket, which the pool listens on without answering. A claim renames the member's folder to
the run's (that waiting connection goes with it) and `repoint()` sends every later stream to the run's sockets:
each stream's host socket is looked up when it opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Protocol

from container.contract import BRIDGE_TARGET_EGRESS, BRIDGE_TARGET_RUN
from container.mux import INITIAL_WINDOW_BYTES, MAX_STREAMS, LocalConnection, Mux, Role
from container.mux_frames import MuxError
from core.logging import get_logger

log = get_logger(__name__)

OPEN_TIMEOUT_SECONDS = 30.0  # an exec that has not started by then is tried again
CONNECT_TIMEOUT_SECONDS = 10.0  # a host socket whose backlog is full makes connect wait instead of refusing
RETRY_DELAYS_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0)  # after a stream that ended or did not open; the last repeats
STABLE_SESSION_SECONDS = 30.0  # a session that lasted this long starts the delays over
MAX_OPENS_PER_MINUTE = 10
RATE_WINDOW_SECONDS = 60.0
TARGETS = (BRIDGE_TARGET_RUN, BRIDGE_TARGET_EGRESS)  # the names a pod may open; any other breaks the protocol


class ByteStream(Protocol):
    """A duplex byte stream into the pod's bridge process: an exec stream, or a local pipe pair in tests."""

    @property
    def reader(self) -> asyncio.StreamReader: ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...

    def describe(self) -> str:
        """Why it ended, as far as it knows (an exit status, the end of its stderr), for the log."""
        ...


Opener = Callable[[], Awaitable[ByteStream]]


class BridgeState(Enum):
    IDLE = "idle"  # run() has not started
    OPENING = "opening"
    UP = "up"  # a session is carrying streams
    WAITING = "waiting"  # pausing before it opens again
    HELD = "held"  # the last minute had its share of openings: waiting for the oldest to age out
    CLOSED = "closed"  # close() was called
    BROKEN = "broken"  # the pod broke the protocol: nothing more is carried for this run


class PodBridge:
    """`run()` keeps the bridge up until `close()`; `sockets` maps each target to its host socket (None: this run
    has no such target, and a stream the pod opens to it is reset)."""

    def __init__(
        self,
        run_id: str,
        opener: Opener,
        sockets: Mapping[str, Path | None],
        *,
        still_running: Callable[[], Awaitable[bool]] | None = None,
        retry_delays_seconds: tuple[float, ...] = RETRY_DELAYS_SECONDS,
        max_opens_per_minute: int = MAX_OPENS_PER_MINUTE,
        max_streams: int = MAX_STREAMS,
        window_bytes: int = INITIAL_WINDOW_BYTES,
    ) -> None:
        _check_targets(sockets)
        self._run_id = run_id
        self._opener = opener
        # Asked before opening again after a session ended: a pod whose container has exited is not reopened
        # (an exec into it only fails), and the bridge ends quietly instead.
        self._still_running = still_running
        self._sockets = dict(sockets)
        self._delays = retry_delays_seconds
        self._max_opens = max_opens_per_minute
        self._max_streams = max_streams
        self._window_bytes = window_bytes
        self._state = BridgeState.IDLE
        self._sessions = 0
        self._changed = asyncio.Event()  # set and replaced at each change: wait_for's waiters check again
        self._closing = asyncio.Event()
        self._mux: Mux | None = None
        self._stream: ByteStream | None = None
        self._running: asyncio.Future[None] | None = None
        self._opening: asyncio.Future[ByteStream] | None = None

    @property
    def state(self) -> BridgeState:
        return self._state

    @property
    def sessions(self) -> int:
        """Sessions begun so far (a HELLO each)."""
        return self._sessions

    @property
    def streams(self) -> int:
        """Streams the current session carries now."""
        return 0 if self._mux is None else self._mux.streams

    def repoint(self, sockets: Mapping[str, Path | None]) -> None:
        """Streams opened from now on go to these sockets (a pool member claimed by a run: its folder renamed)."""
        _check_targets(sockets)
        self._sockets = dict(sockets)

    async def wait_for(self, predicate: Callable[[PodBridge], bool]) -> None:
        """Wait until `predicate(self)` holds; it is checked at every change of state or session."""
        while not predicate(self):
            await self._changed.wait()

    async def run(self) -> None:
        """Carry the run's channel until close(), or until the pod breaks the protocol."""
        if self._running is not None:
            raise RuntimeError("a pod bridge runs once")
        self._running = asyncio.get_running_loop().create_future()
        opened: deque[float] = deque(maxlen=self._max_opens)
        failures = 0
        try:
            while not self._closing.is_set():
                await self._within_rate(opened)
                if self._closing.is_set():
                    break
                opened.append(time.monotonic())
                started = time.monotonic()
                if not await self._session():
                    return  # broken for good
                if time.monotonic() - started >= STABLE_SESSION_SECONDS:
                    failures = 0
                if self._closing.is_set():
                    break
                if self._still_running is not None and not await self._pod_runs():
                    break
                delay = self._delays[min(failures, len(self._delays) - 1)]
                failures += 1
                self._set_state(BridgeState.WAITING)
                await self._pause(delay)
        finally:
            if self._state is not BridgeState.BROKEN:
                self._set_state(BridgeState.CLOSED)
            self._running.set_result(None)

    async def _pod_runs(self) -> bool:
        assert self._still_running is not None
        try:
            return await self._still_running()
        except Exception as exc:  # the API server is away: try the pod again as before
            log.info("pod_bridge_pod_state_unknown", run_id=self._run_id, error=_describe(exc))
            return True

    async def close(self) -> None:
        """End the bridge and every connection it carries, at once; returns once run() has returned."""
        self._closing.set()
        if self._opening is not None:
            self._opening.cancel()
        mux, stream = self._mux, self._stream
        if mux is not None:
            await mux.close()
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.close()
        if self._running is not None:
            await asyncio.wait({self._running})
        else:
            self._set_state(BridgeState.CLOSED)

    async def _session(self) -> bool:
        """One byte stream, from its opening to its end; False when the pod broke the protocol."""
        self._set_state(BridgeState.OPENING)
        opening = self._opening = asyncio.ensure_future(self._opener())  # close() cancels it
        try:
            await asyncio.wait({opening}, timeout=OPEN_TIMEOUT_SECONDS)
        finally:
            self._opening = None
            opening.cancel()
        try:
            stream = await opening
        except asyncio.CancelledError:
            if not self._closing.is_set():
                log.warning("pod_bridge_open_failed", run_id=self._run_id, error="timed out")
            return True
        except Exception as exc:  # the API refused, the pod is not running yet, the network failed
            log.warning("pod_bridge_open_failed", run_id=self._run_id, error=_describe(exc))
            return True
        mux = Mux(
            Role.HOST,
            stream.reader,
            stream.write,
            connect=self._connect,
            targets=TARGETS,
            max_streams=self._max_streams,
            window_bytes=self._window_bytes,
        )
        self._stream, self._mux = stream, mux
        self._sessions += 1
        self._set_state(BridgeState.UP)
        try:
            if self._closing.is_set():  # close() came while this opened: it saw neither
                return True
            await mux.run()
            if not self._closing.is_set():
                log.info("pod_bridge_ended", run_id=self._run_id, detail=stream.describe())
        except MuxError as exc:
            log.error("pod_bridge_protocol_broken", run_id=self._run_id, error=str(exc), detail=stream.describe())
            self._set_state(BridgeState.BROKEN)
            return False
        except Exception as exc:  # the stream failed while sending: opened again like one that ended
            log.warning("pod_bridge_lost", run_id=self._run_id, error=_describe(exc), detail=stream.describe())
        finally:
            self._mux = self._stream = None
            await mux.close()
            with contextlib.suppress(Exception):
                await stream.close()
        return True

    async def _connect(self, target: str) -> LocalConnection | None:
        path = self._sockets.get(target)
        if path is None:
            return None
        async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
            return await asyncio.open_unix_connection(os.fspath(path))

    async def _within_rate(self, opened: deque[float]) -> None:
        """Wait while the last minute already had its share of openings."""
        if len(opened) < self._max_opens:
            return
        wait = opened[0] + RATE_WINDOW_SECONDS - time.monotonic()
        if wait > 0:
            log.warning("pod_bridge_rate_limited", run_id=self._run_id, wait_seconds=round(wait, 1))
            self._set_state(BridgeState.HELD)
            await self._pause(wait)

    async def _pause(self, seconds: float) -> None:
        """Sleep, cut short by close()."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._closing.wait()

    def _set_state(self, state: BridgeState) -> None:
        self._state = state
        self._changed.set()
        self._changed = asyncio.Event()


def _check_targets(sockets: Mapping[str, Path | None]) -> None:
    unknown = set(sockets) - set(TARGETS)
    if unknown:
        raise ValueError(f"unknown bridge targets: {sorted(unknown)}")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
