"""A run's socket serves a bounded number of connections: a container cannot take the host's descriptors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from runner.channel.capped_site import CappedUnixSite

CAP = 4
REQUEST = b"GET / HTTP/1.1\r\nHost: run\r\nConnection: close\r\n\r\n"


@asynccontextmanager
async def capped_socket(
    tmp_path: Path, handler: Callable[[web.Request], Awaitable[web.Response]]
) -> AsyncIterator[Path]:
    """A socket serving `handler` at `/` through the host's capped site (CAP connections at once)."""
    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    socket = tmp_path / "run.sock"
    await CappedUnixSite(runner, str(socket), max_connections=CAP).start()
    try:
        yield socket
    finally:
        await runner.cleanup()


async def test_connections_over_the_cap_are_closed_and_the_held_ones_still_served(tmp_path: Path) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    async with capped_socket(tmp_path, hello) as socket:
        try:
            for _ in range(CAP + 3):
                held.append(await asyncio.open_unix_connection(str(socket)))
            await asyncio.sleep(0.05)
            # Over the cap: closed at once (end of stream without an answer).
            for reader, _ in held[CAP:]:
                assert await asyncio.wait_for(reader.read(), 1) == b""
            # Within the cap: a half-sent request holds its slot; a whole one is answered.
            reader, writer = held[0]
            writer.write(REQUEST)
            answer = await asyncio.wait_for(reader.read(), 2)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hi")
        finally:
            for _, writer in held:
                writer.close()


async def test_a_burst_of_connections_at_once_gets_no_more_than_the_cap(tmp_path: Path) -> None:
    """The loop accepts connections in bursts, making every handler before any is connected: the cap holds
    for a burst as well as for connections made one by one."""
    served = 0
    release = asyncio.Event()

    async def hold(request: web.Request) -> web.Response:
        nonlocal served
        served += 1
        await release.wait()
        return web.Response(text="hi")

    burst = 25 * CAP

    async def ask(socket: Path) -> bytes:
        """The answer, or b"" for a connection closed unanswered (reset, when the request was sent first)."""
        reader, writer = await asyncio.open_unix_connection(str(socket))
        try:
            writer.write(REQUEST)
            return await asyncio.wait_for(reader.read(), 5)
        except ConnectionError:
            return b""
        finally:
            writer.close()

    async with capped_socket(tmp_path, hold) as socket:
        asking = [asyncio.create_task(ask(socket)) for _ in range(burst)]
        await asyncio.sleep(0.5)
        assert served == CAP  # the others were closed as they came
        release.set()
        answers = await asyncio.gather(*asking)
    assert sum(a.startswith(b"HTTP/1.1 200") for a in answers) == CAP
    assert answers.count(b"") == burst - CAP
