"""The web through the door, for real: fake Telegram at the edge, real PTB, SQLite, engine and image, and a
real HTTP server on 127.0.0.1 (allowed by its ip:port, never any other address). The subagent's commands
use Python's urllib with no flags; the container's forwarder and the host's door carry them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from core.store.egress import EgressStore
from core.store.runs import RunStore
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS, until_no_containers

pytestmark = pytest.mark.docker

PAGE = "hello from the web"


def fetch(url: str) -> str:
    """A task line: fetch `url` with urllib (which reads the proxy variables) and print the page or the error."""
    code = (
        "import urllib.request as u\\n"
        "try: print(u.urlopen(URL, timeout=20).read().decode())\\n"
        'except Exception as e: print("refused:", e, getattr(e, "read", lambda: b"")().decode().strip())'
    ).replace("URL", json.dumps(url))
    return f"$ python3 -c $'{code}'"  # bash's $'...': the \\n are the code's line breaks


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


@pytest.fixture
async def site() -> AsyncIterator[tuple[int, int]]:
    """Two web servers on 127.0.0.1: the allowed one, and one the allowlist does not name."""

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    app = web.Application()
    app.router.add_get("/hello", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sites = [web.TCPSite(runner, "127.0.0.1", 0), web.TCPSite(runner, "127.0.0.1", 0)]
    for one in sites:
        await one.start()
    ports = [one._server.sockets[0].getsockname()[1] for one in sites]  # type: ignore[union-attr]
    try:
        yield ports[0], ports[1]
    finally:
        await runner.cleanup()


async def run_result(tg: FakeTelegram, text: str) -> str:
    tg.push_message(GROUP_ID, f"@{tg.bot_username} background: {text}")

    def result_message() -> Any:
        return next((m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None)

    return str((await tg.wait_until(result_message, timeout_seconds=RUN_WAIT_SECONDS)).plain_text)


async def test_an_allowed_host_is_reached_and_everything_else_refused_and_shown(
    tmp_path: Path, tg: FakeTelegram, site: tuple[int, int], subagent_image: str
) -> None:
    allowed, other = site
    settings = make_settings(tmp_path, tg, SUBAGENT_EGRESS="allowlist", SUBAGENT_EGRESS_ALLOW=f"127.0.0.1:{allowed}")
    async with telegram_app(settings, with_subagents=True) as app:
        lines = [
            fetch(f"http://127.0.0.1:{allowed}/hello"),
            fetch(f"http://127.0.0.1:{other}/hello"),  # a port not listed
            fetch(f"http://localhost:{allowed}/hello"),  # a name: only name patterns match it
            "$ env | grep -ci _proxy",
        ]
        result = await run_result(tg, "\n".join(lines))
        (record,) = await RunStore(app.stores.db).for_chat(GROUP_ID, 10)
        store = EgressStore(app.stores.db)
        for _ in range(50):  # the door's events are written within a second of each connection's end
            if len(await store.of_run(record.id, 10)) >= 3:
                break
            await asyncio.sleep(0.1)
        connections = await store.of_run(record.id, 10)
        totals = await store.run_totals(record.id)
        await until_no_containers(GROUP_ID)

    assert PAGE in result
    assert result.count("refused: HTTP Error 403") == 2, result
    assert f"127.0.0.1:{other} is not in SUBAGENT_EGRESS_ALLOW" in result  # the door's reason, read by the run
    assert "\n8\n" in result  # HTTP(S)_PROXY and ALL_PROXY in both cases, and the empty NO_PROXY in both
    shown = [(c.host, c.port, c.allowed) for c in connections]
    assert shown == [("127.0.0.1", allowed, True), ("127.0.0.1", other, False), ("localhost", allowed, False)]
    assert connections[0].address == "127.0.0.1" and connections[0].bytes_down > len(PAGE)
    assert totals.connections == 3 and totals.refused == 2 and totals.bytes_down >= connections[0].bytes_down


async def test_without_egress_there_is_no_door_and_no_proxy(
    tmp_path: Path, tg: FakeTelegram, site: tuple[int, int], subagent_image: str
) -> None:
    allowed, _ = site
    settings = make_settings(tmp_path, tg)  # SUBAGENT_EGRESS=none, the default
    async with telegram_app(settings, with_subagents=True) as app:
        result = await run_result(
            tg, "\n".join([fetch(f"http://127.0.0.1:{allowed}/hello"), "$ env | grep -ci _proxy; ls /crewbot/channel"])
        )
        (record,) = await RunStore(app.stores.db).for_chat(GROUP_ID, 10)
        totals = await EgressStore(app.stores.db).run_totals(record.id)
        await until_no_containers(GROUP_ID)
    assert PAGE not in result and "refused:" in result  # network none: nothing to connect to
    assert "\n0\nrun.sock\n" in result  # no proxy variables, and no door beside the run socket
    assert totals.connections == 0
