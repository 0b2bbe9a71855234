"""The run channel stays under the host's cap of connections to a run's socket (runner/channel/capped_site.py): a
container that sends many requests at once (parallel tool calls) has them wait their turn, not fail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from container.channel import RunChannel
from container.protocol import MESSAGE_PATH, ChannelAnswer
from runner.channel.capped_site import CappedUnixSite

AT_ONCE = 200  # far over the cap, as the bench's 1,000 at once were
ANSWER_DELAY_SECONDS = 0.05  # each answer takes a moment, so the requests overlap


@pytest.fixture
async def capped_socket(tmp_path: Path) -> AsyncIterator[Path]:
    """A run socket with the host's connection cap, answering every progress message after a moment."""

    async def message(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(ANSWER_DELAY_SECONDS)
        return web.Response(
            body=ChannelAnswer(ok=True, detail="sent").model_dump_json(), content_type="application/json"
        )

    app = web.Application()
    app.router.add_post(MESSAGE_PATH, message)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    socket = tmp_path / "run.sock"
    await CappedUnixSite(runner, str(socket)).start()
    yield socket
    await runner.cleanup()


async def test_many_messages_at_once_all_arrive_under_the_hosts_connection_cap(capped_socket: Path) -> None:
    async with RunChannel(capped_socket) as channel:
        answers = await asyncio.gather(
            *(channel.send_message(f"msg{i:05d}", f"step {i}") for i in range(AT_ONCE)),
            return_exceptions=True,
        )

    assert answers == ["sent"] * AT_ONCE
