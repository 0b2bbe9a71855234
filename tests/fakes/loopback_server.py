"""Lifecycle shared by the fake servers: an aiohttp app on 127.0.0.1 (and optionally a Unix socket).

Run it inside the test's event loop (`async with fake:`) or on a thread with its own loop
(`with fake:`), for when the code under test is another process or blocks the test's loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

from aiohttp import web

LOOPBACK_HOST = "127.0.0.1"
# How long stop() lets in-flight handlers finish before cancelling them.
SHUTDOWN_GRACE_SECONDS = 0.5
THREAD_START_TIMEOUT_SECONDS = 10.0


class LoopbackServer:
    """Base class: subclasses build the app and wake their own waiters when the server stops."""

    def __init__(
        self,
        *,
        port: int = 0,
        socket_path: str | os.PathLike[str] | None = None,
        listen_tcp: bool = True,
    ) -> None:
        if not listen_tcp and socket_path is None:
            raise ValueError("a fake server needs TCP or a Unix socket to listen on")
        self._requested_port = port
        self._socket_path = Path(socket_path) if socket_path is not None else None
        self._listen_tcp = listen_tcp
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None

    # --- for subclasses -------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        raise NotImplementedError

    def _on_closing(self) -> None:
        """Called at the start of stop(): end long polls and hangs so shutdown is prompt."""

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    # --- addresses ------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the fake server is not listening on TCP (not started, or Unix socket only)")
        return self._port

    @property
    def origin(self) -> str:
        """`http://127.0.0.1:PORT`, no trailing slash."""
        return f"http://{LOOPBACK_HOST}:{self.port}"

    @property
    def socket_path(self) -> Path | None:
        return self._socket_path

    # --- in the caller's loop -------------------------------------------------------------------

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the fake server is already running")
        self._closing.clear()
        # handler_cancellation: a client that disconnects cancels its handler, which is how the
        # fakes observe a cancelled request (and how abandoned long polls end).
        runner = web.AppRunner(
            self._build_app(),
            handler_cancellation=True,
            shutdown_timeout=SHUTDOWN_GRACE_SECONDS,
            access_log=None,
        )
        await runner.setup()
        try:
            if self._listen_tcp:
                tcp = web.TCPSite(runner, LOOPBACK_HOST, self._requested_port)
                await tcp.start()
                self._port = _bound_port(runner)
            if self._socket_path is not None:
                self._socket_path.unlink(missing_ok=True)
                await web.UnixSite(runner, str(self._socket_path)).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self._closing.set()
        self._on_closing()
        await runner.cleanup()
        self._port = None
        if self._socket_path is not None:
            self._socket_path.unlink(missing_ok=True)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- on a thread of its own -----------------------------------------------------------------

    def start_in_thread(self) -> Self:
        """Serve from a daemon thread with its own event loop; returns once listening."""
        if self._thread is not None:
            raise RuntimeError("the fake server already runs in a thread")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=type(self).__name__, daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(THREAD_START_TIMEOUT_SECONDS)
        except BaseException:
            _stop_loop(loop, thread)
            raise
        self._thread, self._thread_loop = thread, loop
        return self

    def stop_thread(self) -> None:
        thread, loop = self._thread, self._thread_loop
        if thread is None or loop is None:
            return
        self._thread = self._thread_loop = None
        try:
            asyncio.run_coroutine_threadsafe(self.stop(), loop).result(THREAD_START_TIMEOUT_SECONDS)
        finally:
            _stop_loop(loop, thread)

    def __enter__(self) -> Self:
        return self.start_in_thread()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_thread()


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    raise RuntimeError("the TCP site has no bound address")


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(THREAD_START_TIMEOUT_SECONDS)
    if not thread.is_alive():
        loop.close()
