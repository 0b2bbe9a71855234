"""`curl` and `pip` through the door, for real. An image built here by the project's own build with
SUBAGENT_IMAGE_APT=curl and SUBAGENT_IMAGE_PACKAGES=pip (under a repository of its own, removed at the end with
its tools image and downloads); fake Telegram, real PTB, SQLite, engine and door; and a web server on
127.0.0.1 (never any other address) serving a page and a PEP 503 index with one tiny wheel made here.

With SUBAGENT_EGRESS=allowlist and that server's ip:port the only entry, a subagent's `curl` and
`python -m pip download` work as they would anywhere; another port is refused (403), and so is a name, before
anything is resolved or connected to; the run's records, its totals and `/subagents <run id>` show all five."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import secrets
import shutil
import socket
import time
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from aiohttp import web

from core.egress_rules import IpAddress
from core.store.egress import EgressRecord, EgressStore
from core.store.runs import RunStore
from runner.egress import door as door_module
from runner.egress.resolve import LOOKUPS_PER_DOOR, Resolver, SystemLookups
from runner.egress.tunnel import CONNECT_SECONDS
from runner.egress.tunnel import connect as real_connect
from runner.runtimes.image import build_image
from runner.runtimes.image_install import tools_repository
from runner.runtimes.image_tools import ImageTools, installed_tools
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.docker_helpers import TEST_LABEL
from tests.runner.test_subagents_e2e import until_no_containers

pytestmark = pytest.mark.docker

TOOLS = ImageTools.of(["pip"], ["curl"])
ENGINE_TIMEOUT_SECONDS = 600
RUN_WAIT_SECONDS = 300.0  # seven commands, pip's start-up among them, on a loaded 2-core machine
EVENT_WAIT_SECONDS = 30.0  # the door's events are written within a second of each connection's end
EVENT_POLL_SECONDS = 0.1
PAGE = "hello from the web"
PACKAGE, VERSION = "tinypkg", "0.1"
WHEEL = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
REFUSED_NAME = "example.org"


@pytest.fixture(scope="module")
def tools_image(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The subagent image with curl and pip, made once for the module; it, its tools image and the downloads
    are removed at the end. A repository of its own: no other run's build or clean-up touches it."""
    name = f"crewbot-agent-egress-test-{secrets.token_hex(4)}:latest"
    cache = tmp_path_factory.mktemp("egress-tools-cache")
    client = docker.from_env(timeout=ENGINE_TIMEOUT_SECONDS)
    try:
        build_image(name, tools=TOOLS, cache_dir=cache, log=lambda line: None)
        yield name
    finally:
        for repository in (name.rpartition(":")[0], tools_repository(name)):  # the image first, then its base
            for image in client.images.list(name=repository):
                for tag in image.tags:
                    with contextlib.suppress(docker.errors.NotFound):
                        client.images.remove(tag, force=True)
        client.close()
        shutil.rmtree(cache, ignore_errors=True)


def tiny_wheel() -> bytes:
    """A minimal pure-Python wheel: the module, METADATA, WHEEL and a RECORD of their hashes."""
    dist_info = f"{PACKAGE}-{VERSION}.dist-info"
    files = {
        f"{PACKAGE}/__init__.py": b'GREETING = "hello from tinypkg"\n',
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: crewbot-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }

    def hashed(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={hashed(data)},{len(data)}\n" for path, data in files.items())
    files[f"{dist_info}/RECORD"] = f"{record}{dist_info}/RECORD,,\n".encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return buffer.getvalue()


@dataclass(slots=True)
class Site:
    """Two web servers on 127.0.0.1: the allowed one (page and index), and one the allowlist does not name."""

    allowed: int
    other: int
    wheel_sha256: str
    served: list[tuple[int, str]] = field(default_factory=list)  # (port, path) of every request that arrived


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    wheel = tiny_wheel()
    digest = hashlib.sha256(wheel).hexdigest()
    served: list[tuple[int, str]] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
        served.append((int(sockname[1]) if sockname else 0, request.path))
        response: web.StreamResponse = await handler(request)
        return response

    def html(body: str) -> web.Response:
        return web.Response(text=f"<!DOCTYPE html><html><body>{body}</body></html>", content_type="text/html")

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    async def index(request: web.Request) -> web.Response:
        return html(f'<a href="{PACKAGE}/">{PACKAGE}</a>')

    async def project(request: web.Request) -> web.Response:
        return html(f'<a href="/files/{WHEEL}#sha256={digest}">{WHEEL}</a>')

    async def download(request: web.Request) -> web.Response:
        return web.Response(body=wheel, content_type="application/octet-stream")

    app = web.Application(middlewares=[record])
    app.router.add_get("/hello", page)
    app.router.add_get("/simple/", index)
    app.router.add_get(f"/simple/{PACKAGE}/", project)
    app.router.add_get(f"/files/{WHEEL}", download)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sites = [web.TCPSite(runner, "127.0.0.1", 0), web.TCPSite(runner, "127.0.0.1", 0)]
    for one in sites:
        await one.start()
    ports = [one._server.sockets[0].getsockname()[1] for one in sites]  # type: ignore[union-attr]
    try:
        yield Site(allowed=ports[0], other=ports[1], wheel_sha256=digest, served=served)
    finally:
        await runner.cleanup()


@dataclass(slots=True)
class DoorSpy:
    """What the doors looked up and connected to: the real resolver and connect, watched."""

    resolved: list[str] = field(default_factory=list)
    connected: list[str] = field(default_factory=list)


@pytest.fixture
def door_spy(monkeypatch: pytest.MonkeyPatch) -> DoorSpy:
    spy = DoorSpy()

    real_for_door = SystemLookups.for_door

    def for_door(lookups: SystemLookups, max_in_flight: int = LOOKUPS_PER_DOOR) -> Resolver:
        inner = real_for_door(lookups, max_in_flight)

        async def resolver(host: str, port: int) -> list[IpAddress]:
            spy.resolved.append(f"{host}:{port}")
            return await inner(host, port)

        return resolver

    async def connect(
        addresses: list[IpAddress], port: int, *, seconds: float = CONNECT_SECONDS
    ) -> tuple[IpAddress, socket.socket]:
        spy.connected.extend(f"{address}:{port}" for address in addresses)
        return await real_connect(addresses, port, seconds=seconds)

    monkeypatch.setattr(SystemLookups, "for_door", for_door)
    monkeypatch.setattr(door_module, "connect", connect)
    return spy


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


def test_the_image_has_curl_and_its_venv_with_pip_first_on_the_path(tools_image: str) -> None:
    client = docker.from_env(timeout=ENGINE_TIMEOUT_SECONDS)
    try:
        pip_versions, apt_versions = installed_tools(client.images.get(tools_image).labels)
        script = "command -v python python3 curl; /opt/venv/bin/python -m pip --version; python -m pip --version"
        container = client.containers.run(
            tools_image, ["-c", script], entrypoint=["/bin/bash"], detach=True, network_mode="none",
            read_only=True, tmpfs={"/tmp": "rw,size=16m"}, cap_drop=["ALL"],
            labels={TEST_LABEL: "test_egress_tools_e2e"},
        )  # fmt: skip
        try:
            code = int(container.wait(timeout=120)["StatusCode"])
            output = container.logs().decode(errors="replace")
        finally:
            container.remove(force=True)
    finally:
        client.close()

    assert list(pip_versions) == ["pip"] and list(apt_versions) == ["curl"]
    assert code == 0, output
    lines = output.splitlines()
    # The subagent's `python` and `python3` are the venv's, which holds SUBAGENT_IMAGE_PACKAGES.
    assert lines[:3] == ["/opt/venv/bin/python", "/opt/venv/bin/python3", "/usr/bin/curl"], output
    assert lines[3].startswith(f"pip {pip_versions['pip']} from /opt/venv/") and lines[4] == lines[3], output


async def run_result(tg: FakeTelegram, text: str) -> str:
    tg.push_message(GROUP_ID, f"@{tg.bot_username} background: {text}")

    def result_message() -> Any:
        return next((m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None)

    return str((await tg.wait_until(result_message, timeout_seconds=RUN_WAIT_SECONDS)).plain_text)


async def recorded(store: EgressStore, run_id: str, count: int) -> list[EgressRecord]:
    deadline = time.monotonic() + EVENT_WAIT_SECONDS
    for _ in range(int(EVENT_WAIT_SECONDS / EVENT_POLL_SECONDS)):
        if len(await store.of_run(run_id, 50)) >= count or time.monotonic() > deadline:
            break
        await asyncio.sleep(EVENT_POLL_SECONDS)
    return await store.of_run(run_id, 50)


async def command_reply(tg: FakeTelegram, text: str, starts: str) -> str:
    tg.push_message(GROUP_ID, text)

    def reply() -> Any:
        return next((m for m in tg.sent_messages(GROUP_ID) if m.plain_text.startswith(starts)), None)

    return str((await tg.wait_until(reply, timeout_seconds=RUN_WAIT_SECONDS)).plain_text)


async def test_curl_and_pip_reach_the_allowed_host_and_everything_else_is_refused_and_shown(
    tools_image: str, tmp_path: Path, tg: FakeTelegram, site: Site, door_spy: DoorSpy
) -> None:
    allowed, other = f"127.0.0.1:{site.allowed}", f"127.0.0.1:{site.other}"
    settings = make_settings(
        tmp_path, tg, SUBAGENT_IMAGE=tools_image, SUBAGENT_EGRESS="allowlist", SUBAGENT_EGRESS_ALLOW=allowed
    )
    pip = f"python -m pip download --disable-pip-version-check --no-deps --index-url http://{allowed}/simple/"
    lines = [
        "$ command -v python curl",
        f"$ curl -fsS http://{allowed}/hello",
        f"$ {pip} -d /tmp/dl {PACKAGE} && ls /tmp/dl && sha256sum /tmp/dl/{WHEEL}",
        f"$ curl -sS -o /dev/null -w 'status %{{http_code}}' http://{other}/hello",
        f'$ curl -sS https://{REFUSED_NAME}/; echo "curl exit $?"',
    ]
    async with telegram_app(settings, with_subagents=True) as app:
        result = await run_result(tg, "\n".join(lines))
        (run,) = await RunStore(app.stores.db).for_chat(GROUP_ID, 10)
        store = EgressStore(app.stores.db)
        # In the order they were asked for (each is recorded when it ends).
        connections = sorted(await recorded(store, run.id, 5), key=lambda c: c.started_at)
        totals = await store.run_totals(run.id)
        shown = await command_reply(tg, f"/subagents {run.id}", f"Crew: Run {run.id} (")
        await until_no_containers(GROUP_ID)

    # What the subagent saw: the page, the wheel (its bytes as served), a 403, and curl's refused tunnel.
    assert "Ran 5 command(s)." in result, result
    assert "/opt/venv/bin/python\n/usr/bin/curl" in result, result
    assert f"\n{PAGE}\n" in result, result
    assert f"Saved /tmp/dl/{WHEEL}" in result and f"\n{WHEEL}\n{site.wheel_sha256}  /tmp/dl/{WHEEL}" in result, result
    assert "status 403" in result, result
    assert "CONNECT tunnel failed, response 403" in result and "curl exit 56" in result, result

    # What the servers saw: the allowed one the three requests, the other one nothing.
    assert site.served == [
        (site.allowed, "/hello"),
        (site.allowed, f"/simple/{PACKAGE}/"),
        (site.allowed, f"/files/{WHEEL}"),
    ]
    # The door looked nothing up (the name was refused before that) and connected only to the allowed address.
    assert door_spy.resolved == [] and door_spy.connected == [allowed] * 3

    # What was recorded: five connections, two refused, each with its reason.
    assert [(c.host, c.port, c.allowed, c.address) for c in connections] == [
        ("127.0.0.1", site.allowed, True, "127.0.0.1"),
        ("127.0.0.1", site.allowed, True, "127.0.0.1"),
        ("127.0.0.1", site.allowed, True, "127.0.0.1"),
        ("127.0.0.1", site.other, False, None),
        (REFUSED_NAME, 443, False, None),
    ]
    assert connections[0].bytes_down > len(PAGE) and connections[2].bytes_down > len(tiny_wheel())
    assert connections[3].reason == f"{other} is not in SUBAGENT_EGRESS_ALLOW"
    assert connections[4].reason == f"{REFUSED_NAME}:443 is not in SUBAGENT_EGRESS_ALLOW"
    assert (totals.connections, totals.refused) == (5, 2)
    assert totals.bytes_down == sum(c.bytes_down for c in connections)
    assert totals.bytes_up == sum(c.bytes_up for c in connections) > 0

    # What /subagents <run id> shows: the totals, the five connections, then the run's log.
    shown_lines = shown.splitlines()
    assert shown_lines[0].startswith(f"Crew: Run {run.id} (") and ": completed" in shown_lines[0], shown
    assert shown_lines[1].startswith("Web: 5 connections (2 refused), "), shown
    assert [line.split(",")[0] for line in shown_lines[2:5]] == [f"{allowed} → 127.0.0.1"] * 3, shown
    assert shown_lines[5:7] == [
        f"{other} refused: {other} is not in SUBAGENT_EGRESS_ALLOW",
        f"{REFUSED_NAME}:443 refused: {REFUSED_NAME}:443 is not in SUBAGENT_EGRESS_ALLOW",
    ], shown
    assert f"tool bash(command='curl -fsS http://{allowed}/hello')" in shown, shown
