"""Bytes between two connected sockets without an event loop on their path: each direction is a thread that moves
them with `os.splice` through a pipe of its own (the kernel hands pages over; nothing is copied into Python).

What each direction holds is its pipe (PIPE_BYTES) and the kernel's socket buffers (a Unix socket's send buffer
raised to UNIX_SEND_BYTES, doubled by the kernel: fewer wake-ups per chunk): a peer that stops reading
stops its direction there, and memory does not grow. A direction that reads the end of its source shuts down
its target's sending (a half-close passes through); one that breaks shuts both sockets down, so the other
direction ends too. `cut()` (from the event loop, any time) shuts both sockets down: a thread blocked in a
read or a write wakes at once. `run()` returns only once both threads have left the sockets, so its caller
may close them then; a cancelled `run()` cuts and still waits for them (they end within a system call).

With an `allowance` (thread-safe `take`), a direction moves only the bytes it grants, counted in
`bytes_forward` / `bytes_back`; the chunk that spends it is cut short, that direction stops, and `on_spent` is
called on the loop. Where splice is not offered (a kernel or sandbox without it for these sockets), a direction
falls back to copies through a buffer of the same size.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import threading
from collections.abc import Callable
from enum import Enum
from typing import Protocol

PIPE_BYTES = 256 * 1024  # one chunk in flight per direction; 1 MiB pipes would exhaust pipe-user-pages-soft sooner
# A Unix stream socket's send waits once its own queue holds SO_SNDBUF (208 KiB by default: less than one pipe), so
# a direction slept and woke for every part of a chunk; room for several halves its sleeps and its CPU. The kernel
# caps what is asked at net.core.wmem_max, then doubles it.
UNIX_SEND_BYTES = 1024 * 1024
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# splice refused for these file types (or not offered at all): the direction copies instead.
NOT_SPLICEABLE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})


class Allowance(Protocol):
    """What the bytes of both directions are counted against; `take` is called from the relay's threads."""

    @property
    def spent(self) -> bool: ...

    def take(self, wanted: int) -> int: ...


class RelayEnd(Enum):
    DONE = "done"  # both directions ended with their source's end
    BROKEN = "broken"  # a socket failed: both were shut down
    CUT = "cut"  # cut() was called
    SPENT = "spent"  # the allowance ran out


class SpliceRelay:
    """`await SpliceRelay(a, b).run()` carries bytes a → b ("forward") and b → a ("back") until both end."""

    def __init__(
        self,
        near: socket.socket,
        far: socket.socket,
        *,
        allowance: Allowance | None = None,
        on_spent: Callable[[], None] | None = None,
    ) -> None:
        self._near = near
        self._far = far
        self._allowance = allowance
        self._on_spent = on_spent
        self._lock = threading.Lock()
        self._end: RelayEnd | None = None
        self._running = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finished: asyncio.Future[None] | None = None
        self.bytes_forward = 0
        self.bytes_back = 0

    async def run(self, forward_first: bytes = b"", back_first: bytes = b"") -> RelayEnd:
        """Carry until both directions end; `forward_first` goes to `far` before `near`'s bytes, `back_first` to
        `near` before `far`'s. Returns how it ended."""
        if self._finished is not None:
            raise RuntimeError("a relay runs once")
        self._loop = asyncio.get_running_loop()
        self._finished = self._loop.create_future()
        for sock in (self._near, self._far):
            sock.setblocking(True)
            if sock.family == socket.AF_UNIX:
                with contextlib.suppress(OSError):  # the default still carries, at more wake-ups
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BYTES)
        directions = ((self._near, self._far, forward_first, True), (self._far, self._near, back_first, False))
        with self._lock:
            self._running = len(directions)  # before any starts: the first to end must not look like the last
        for source, target, first, forward in directions:
            thread = threading.Thread(
                target=self._direction, args=(source, target, first, forward), name="splice-relay", daemon=True
            )
            try:
                thread.start()
            except RuntimeError:  # no thread to be had (a pids limit): this connection cannot be carried
                self._stop(RelayEnd.BROKEN)
                self._left()
        cancelled = False
        while not self._finished.done():
            try:
                await asyncio.shield(self._finished)
            except asyncio.CancelledError:
                cancelled = True
                self.cut()  # the threads wake within a system call; the sockets are theirs until then
        if cancelled:
            raise asyncio.CancelledError
        assert self._end is not None
        return self._end

    def cut(self) -> None:
        """End both directions now, whatever they hold."""
        self._stop(RelayEnd.CUT)

    # -- the threads ---------------------------------------------------------------------------------

    def _stop(self, end: RelayEnd) -> None:
        with self._lock:
            if self._end is None:
                self._end = end
        for sock in (self._near, self._far):
            with contextlib.suppress(OSError):  # already closed, or not connected any more
                sock.shutdown(socket.SHUT_RDWR)

    def _left(self) -> None:
        """A direction's thread is done with the sockets; the last one out finishes the run."""
        with self._lock:
            self._running -= 1
            last = self._running == 0
            if last and self._end is None:
                self._end = RelayEnd.DONE
        if last:
            self._tell(self._settle)

    def _settle(self) -> None:
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)

    def _tell(self, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            self._loop.call_soon_threadsafe(callback)

    def _stopped(self) -> bool:
        return self._end is not None

    def _direction(self, source: socket.socket, target: socket.socket, first: bytes, forward: bool) -> None:
        try:
            if first and not self._send(target, first, forward):
                return
            if not self._splice(source, target, forward):
                return
            if not self._stopped():
                with contextlib.suppress(OSError):
                    target.shutdown(socket.SHUT_WR)  # this direction is over; the other may still carry the answer
        except OSError:
            if not self._stopped():
                self._stop(RelayEnd.BROKEN)
        finally:
            self._left()

    def _grant(self, wanted: int, forward: bool) -> int:
        granted = wanted if self._allowance is None else self._allowance.take(wanted)
        if forward:
            self.bytes_forward += granted
        else:
            self.bytes_back += granted
        return granted

    def _spent(self, granted: int, wanted: int) -> bool:
        """After a chunk: True when the allowance has run out (the owner is told; this direction stops)."""
        if self._allowance is None or (granted == wanted and not self._allowance.spent):
            return False
        self._stop(RelayEnd.SPENT)
        if self._on_spent is not None:
            self._tell(self._on_spent)
        return True

    def _send(self, target: socket.socket, data: bytes, forward: bool) -> bool:
        """`data` to `target` as far as the allowance grants it; False when this direction must stop."""
        granted = self._grant(len(data), forward)
        if granted:
            target.sendall(data[:granted])
        return not self._spent(granted, len(data)) and not self._stopped()

    def _splice(self, source: socket.socket, target: socket.socket, forward: bool) -> bool:
        """Until `source`'s end (True) or until this direction must stop (False)."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            with contextlib.suppress(OSError):  # past the user's pipe pages: the default size still works
                fcntl.fcntl(write_end, F_SETPIPE_SZ, PIPE_BYTES)
            while not self._stopped():
                try:
                    count = os.splice(source.fileno(), write_end, PIPE_BYTES)
                except OSError as exc:
                    if exc.errno not in NOT_SPLICEABLE:
                        raise
                    return self._copy(source, target, forward)
                if count == 0:
                    return True
                granted = self._grant(count, forward)
                self._drain(read_end, target, granted)
                if self._spent(granted, count):
                    return False
            return False
        finally:
            os.close(read_end)
            os.close(write_end)

    @staticmethod
    def _drain(read_end: int, target: socket.socket, count: int) -> None:
        """`count` bytes of the pipe into `target` (what was not granted stays in the pipe, and is dropped)."""
        while count:
            try:
                count -= os.splice(read_end, target.fileno(), count)
            except OSError as exc:
                if exc.errno not in NOT_SPLICEABLE:
                    raise
                target.sendall(os.read(read_end, count))  # the pipe holds at least count: one read takes it
                count = 0

    def _copy(self, source: socket.socket, target: socket.socket, forward: bool) -> bool:
        buffer = bytearray(PIPE_BYTES)
        view = memoryview(buffer)
        while not self._stopped():
            count = source.recv_into(buffer)
            if count == 0:
                return True
            granted = self._grant(count, forward)
            if granted:
                target.sendall(view[:granted])
            if self._spent(granted, count):
                return False
        return False
