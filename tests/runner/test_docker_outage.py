"""The Docker engine is unreachable, then back, with the real app, the real engine and the real image.

DOCKER_HOST points at a Unix socket this test controls: a relay in front of the real engine that can be
taken down (its socket removed and every open connection dropped, as when the engine stops) and brought
back. A spawn while the engine is away fails clearly; the bot keeps answering; once the engine is back a
spawn works, both when the runtime never had a client and when its client lost the engine in between."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import docker
import pytest

from core.store.runs import RunRecord, RunStore
from crewbot.app import App
from runner.runtimes.runtime import LABEL_CHAT_ID
from tests.fakes.telegram_server import FakeTelegram, SentMessage
from tests.harness import make_settings, telegram_app
from tests.runner.test_subagents_e2e import RUN_WAIT_SECONDS

pytestmark = pytest.mark.docker

REAL_SOCKET = Path("/var/run/docker.sock")
RELAY_CHUNK_BYTES = 65536


class EngineRelay:
    """A Unix socket that forwards to the real engine while up; down, it is gone and its connections cut."""

    def __init__(self, path: Path, target: Path) -> None:
        self.path = path
        self._target = target
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def up(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(str(self._target))
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            for end in (writer, up_writer):
                end.close()
                self._writers.discard(end)
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await source.read(RELAY_CHUNK_BYTES):
                sink.write(chunk)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()


def unique_group_id() -> int:
    return -(2_000_000_000 + secrets.randbelow(900_000_000))


def chat_containers(chat_id: int) -> list[docker.models.containers.Container]:
    """Straight from the real engine (DOCKER_HOST points at the relay in these tests)."""
    client = docker.DockerClient(base_url=f"unix://{REAL_SOCKET}")
    try:
        return list(client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_CHAT_ID}={chat_id}"}))
    finally:
        client.close()


def remove_chat_containers(chat_id: int) -> None:
    for container in chat_containers(chat_id):
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


@pytest.fixture
async def relay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EngineRelay]:
    engine = EngineRelay(tmp_path / "docker.sock", REAL_SOCKET)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{engine.path}")
    try:
        yield engine
    finally:
        await engine.down()


async def runs_ended(runs: RunStore, chat_id: int, count: int) -> list[RunRecord]:
    """Until the chat has `count` runs, all ended; newest first."""
    deadline = time.monotonic() + RUN_WAIT_SECONDS
    while True:
        records = await runs.for_chat(chat_id, 50)
        if len(records) >= count and all(r.status not in ("queued", "running") for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"runs did not end: {[(r.id, r.status) for r in records]}")
        await asyncio.sleep(0.1)


def text_with(tg: FakeTelegram, chat_id: int, needle: str) -> Callable[[], SentMessage | None]:
    return lambda: next((m for m in tg.sent_messages(chat_id) if needle in m.plain_text), None)


async def spawn(tg: FakeTelegram, app: App, chat_id: int, token: str, n: int) -> RunRecord:
    """Ask for a background `echo` (run number n of the chat); return the run once it has ended.

    `token-4n` appears only in the command's output, never in the task or its label."""
    count = len(tg.sent_messages(chat_id))
    tg.push_message(chat_id, f"@{tg.bot_username} background: $ echo {token}-$((40+{n}))")
    await tg.wait_for_messages(chat_id, count + 1, timeout_seconds=20)  # "Started subagent run …"
    (record, *_) = await runs_ended(RunStore(app.stores.db), chat_id, n)
    return record


async def test_spawn_fails_clearly_while_the_engine_is_away_and_works_when_it_is_back(
    tmp_path: Path, tg: FakeTelegram, relay: EngineRelay, subagent_image: str
) -> None:
    chat = unique_group_id()
    tg.add_chat(chat, title="engine outage")
    settings = make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=str(chat), SUBAGENT_IMAGE=subagent_image, LOG_LEVEL="INFO")
    token = f"out{secrets.token_hex(3)}"
    try:
        async with telegram_app(settings, with_subagents=True) as app:
            # 1. No engine, and no client built yet: the run fails and the chat is told why.
            failed = await spawn(tg, app, chat, token, 1)
            assert failed.status == "failed" and failed.container_id is None
            assert failed.error is not None and failed.error.startswith(
                "could not start its container: Docker engine not reachable"
            )
            told = await tg.wait_until(text_with(tg, chat, "Failed: could not start its container: "))
            assert told.plain_text.startswith(f"Crew: [Task: echo {token}-$((40+1))]\nFailed: could not start")
            assert str(relay.path) in told.plain_text  # names the endpoint it could not reach

            # The bot still answers plain messages.
            tg.push_message(chat, f"@{tg.bot_username} are you there?")
            await tg.wait_until(text_with(tg, chat, "are you there?"))
            await app.wait_quiet(chat)

            # 2. The engine is back: a spawn runs end to end.
            await relay.up()
            done = await spawn(tg, app, chat, token, 2)
            assert done.status == "completed", done.error
            await tg.wait_until(text_with(tg, chat, f"{token}-42"), timeout_seconds=RUN_WAIT_SECONDS)

            # 3. Away again, its pooled connections cut: a clear failure again.
            await relay.down()
            again = await spawn(tg, app, chat, token, 3)
            assert again.status == "failed" and again.error is not None
            assert again.error.startswith("could not start its container: Docker engine not reachable")

            # 4. Back again: the same client recovers.
            await relay.up()
            last = await spawn(tg, app, chat, token, 4)
            assert last.status == "completed", last.error
            await tg.wait_until(text_with(tg, chat, f"{token}-44"), timeout_seconds=RUN_WAIT_SECONDS)
            await app.wait_quiet(chat)

            outcomes = [m.plain_text for m in tg.sent_messages(chat) if m.plain_text.startswith("Crew: [Task:")]
            assert len(outcomes) == 4  # one outcome message per run
            await wait_no_containers(chat)  # removed just after the outcome is delivered
    finally:
        await asyncio.to_thread(remove_chat_containers, chat)


async def wait_no_containers(chat: int, limit_seconds: float = 20.0) -> None:
    async with asyncio.timeout(limit_seconds):
        while True:
            if not await asyncio.to_thread(chat_containers, chat):
                return
            await asyncio.sleep(0.1)


OUTAGE_SECONDS = 1.0  # how long the engine is away in the middle of a run (a daemon restart)


async def test_engine_blip_while_a_subagent_runs_does_not_lose_its_result(
    tmp_path: Path, tg: FakeTelegram, relay: EngineRelay, subagent_image: str
) -> None:
    chat = unique_group_id()
    tg.add_chat(chat, title="engine blip")
    settings = make_settings(tmp_path, tg, ALLOWED_CHAT_IDS=str(chat), SUBAGENT_IMAGE=subagent_image, LOG_LEVEL="INFO")
    token = f"blip{secrets.token_hex(3)}"
    await relay.up()
    try:
        async with telegram_app(settings, with_subagents=True) as app:
            runs = RunStore(app.stores.db)
            tg.push_message(chat, f"@{tg.bot_username} background: $ sleep 4 && echo {token}-$((40+9))")
            deadline = time.monotonic() + RUN_WAIT_SECONDS
            while not [r for r in await runs.for_chat(chat, 5) if r.status == "running" and r.container_id]:
                assert time.monotonic() < deadline, "the run did not start"
                await asyncio.sleep(0.1)
            await relay.down()  # the manager is waiting on the container: that connection is cut
            await asyncio.sleep(OUTAGE_SECONDS)
            await relay.up()
            (record,) = await runs_ended(runs, chat, 1)
            assert record.status == "completed", f"{record.status}: {record.error}"
            await tg.wait_until(text_with(tg, chat, f"{token}-49"), timeout_seconds=RUN_WAIT_SECONDS)
            await app.wait_quiet(chat)
            await wait_no_containers(chat)
    finally:
        await asyncio.to_thread(remove_chat_containers, chat)
