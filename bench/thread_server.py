"""Blocking servers in threads of a benchmark's process (its event loop is not theirs): an accept loop a
listener, a thread a connection; at the end every thread is joined and every socket closed.

Used by the egress benchmark's bare relays (bench/egress_rig.py) and the bridge benchmark's byte server
(bench/bridge_rig.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Self

ACCEPT_POLL_SECONDS = 0.2  # how soon an accept loop sees that the server is ending
JOIN_SECONDS = 5.0
LISTEN_BACKLOG = 16


class ThreadServer:
    """`with ThreadServer(name) as server: server.serve(listener, handle)`: `handle(connection)` runs in a thread
    of its own for each connection accepted on `listener`, until the block ends."""

    def __init__(self, name: str, *, connection_timeout: float | None = None) -> None:
        self._name = name
        self._connection_timeout = connection_timeout  # None: blocking without end
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(JOIN_SECONDS)
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def serve(self, listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
        """Listen on the bound `listener` (closed at the end) and hand each connection to `handle`."""
        listener.listen(LISTEN_BACKLOG)
        listener.settimeout(ACCEPT_POLL_SECONDS)
        self.keep(listener)
        self.spawn(self._accept_loop, listener, handle)

    def spawn(self, target: Callable[..., None], *args: object) -> None:
        """`target(*args)` in a thread joined at the end."""
        thread = threading.Thread(target=target, args=args, name=self._name, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def keep(self, sock: socket.socket) -> None:
        """Close `sock` at the end."""
        with self._lock:
            self._sockets.append(sock)

    def _accept_loop(self, listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            connection.settimeout(self._connection_timeout)
            self.keep(connection)
            self.spawn(handle, connection)
