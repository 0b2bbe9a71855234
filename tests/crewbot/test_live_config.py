"""`crewbot config set` against a running bot: the new cap holds for the next runs, a bad value is refused
with the start-up line, running containers are left alone, and the value outlives a restart.

The bot runs in this process (`serve`, as `crewbot run` runs it) on an in-memory engine whose containers
run until the test ends them; the CLI runs as a real subprocess talking to the control socket.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from container.protocol import SpawnRequest
from core.settings import Settings
from core.store.db import Database
from core.store.runs import RunStatus, RunStore
from core.store.setting_overrides import SettingOverrideStore, now_change
from core.stores import Stores
from crewbot.control import control_socket_path
from crewbot.serve import serve
from runner.ipc.requests import ensure_chat_dirs, write_spawn_request
from runner.storage.paths import DataPaths
from tests.bot.helpers import RecordingChannel
from tests.crewbot.cli_env import crewbot_env, run_crewbot
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.harness import GROUP_ID, make_settings

pytestmark = pytest.mark.timeout(240)

WAIT_SECONDS = 60.0
POLL_SECONDS = 0.05


async def _block(container: MemoryContainer) -> int | None:
    await asyncio.Event().wait()  # runs until the test finishes it
    return None


def settings_for(data_dir: Path, queue_limit: int = 0) -> Settings:
    # Queue 0 by default: over the cap is a refusal, which shows the cap in force at each request.
    return make_settings(
        data_dir, MAX_SUBAGENTS_PER_CHAT=10, ALLOWED_CHAT_IDS=str(GROUP_ID), SUBAGENT_QUEUE_LIMIT=queue_limit
    )


@asynccontextmanager
async def running_bot(settings: Settings, runtime: MemoryRuntime) -> AsyncIterator[None]:
    """`serve` until the block ends, then SIGTERM, as a process supervisor stops it."""
    task = asyncio.create_task(serve(settings, RecordingChannel(), runtime))
    socket_path = control_socket_path(settings.data_dir)
    async with asyncio.timeout(WAIT_SECONDS):
        while not socket_path.is_socket():
            assert not task.done(), task.exception()
            await asyncio.sleep(0.05)
    try:
        yield
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # serve's own handler turns it into a clean stop
        async with asyncio.timeout(WAIT_SECONDS):
            assert await task == 0


async def cli(data_dir: Path, *args: str, **env: str) -> tuple[int, str, str]:
    done = await asyncio.to_thread(run_crewbot, list(args), crewbot_env(data_dir, **env), data_dir.parent)
    return done.returncode, done.stdout, done.stderr


async def spawn_in(folder: str, settings: Settings, runs: RunStore, ids: list[str]) -> None:
    """Spawn requests as the main agent writes them; returns once every one has its run record."""
    ipc_root = DataPaths(settings.data_dir).ipc_root
    for run_id in ids:
        write_spawn_request(ipc_root, folder, SpawnRequest(request_id=run_id, task="$ sleep 60", label=run_id))
    await poll(lambda: _all_recorded(runs, ids))


async def _all_recorded(runs: RunStore, ids: list[str]) -> bool:
    return all([await runs.exists(run_id) for run_id in ids])


async def _all_final(runs: RunStore, ids: list[str]) -> bool:
    return not any(s in (RunStatus.QUEUED, RunStatus.RUNNING) for s in await statuses(runs, ids))


async def poll(check: Callable[[], Awaitable[bool]]) -> None:
    """The store has no change events: look again until it holds (bounded by WAIT_SECONDS)."""
    async with asyncio.timeout(WAIT_SECONDS):
        while True:
            if await check():
                return
            await asyncio.sleep(POLL_SECONDS)


async def statuses(runs: RunStore, ids: list[str]) -> list[RunStatus]:
    records = [await runs.get(run_id) for run_id in ids]
    return [r.status for r in records if r is not None]


async def finish_all(runtime: MemoryRuntime, runs: RunStore, ids: list[str]) -> None:
    for spec in runtime.started_specs:
        for info in await runtime.list({"crewbot.run_id": spec.labels["crewbot.run_id"]}):
            if info.status == "running":
                runtime.finish(info.id, 0)
    await poll(lambda: _all_final(runs, ids))
    await runtime.until(lambda: runtime.running_count() == 0)


async def test_config_set_changes_the_cap_of_the_running_bot_and_outlives_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("crewbot.serve.gc.freeze", lambda: None)  # the test process lives on
    data_dir = tmp_path / "data"
    settings = settings_for(data_dir)
    stores = await Stores.open(settings)
    folder = (await stores.chats.ensure(GROUP_ID, "group", "ops")).folder
    await stores.db.close()
    ensure_chat_dirs(DataPaths(data_dir).ipc_root, folder)
    spawn = functools.partial(spawn_in, folder)

    runtime = MemoryRuntime(on_start=_block)
    async with runtime, running_bot(settings, runtime):
        assert stat.S_IMODE(control_socket_path(data_dir).stat().st_mode) == 0o600
        db = await Database.open(settings.db_path)
        runs = RunStore(db)

        # A bad value: refused with the very line a bad value in the environment stops start-up with.
        code, _, refused = await cli(data_dir, "config", "set", "MAX_CONCURRENT_SUBAGENTS=0")
        start_code, _, at_start = await cli(data_dir, "migrate", MAX_CONCURRENT_SUBAGENTS="0")
        assert code == 1 and start_code == 2
        assert refused.strip().removeprefix("crewbot: ") == at_start.strip().removeprefix("crewbot: cannot start: ")
        assert "invalid setting MAX_CONCURRENT_SUBAGENTS" in refused
        assert settings.max_concurrent_subagents == 3  # unchanged

        code, out, err = await cli(data_dir, "config", "set", "MAX_CONCURRENT_SUBAGENTS=2")
        assert code == 0, err
        assert "MAX_CONCURRENT_SUBAGENTS: 3 -> 2" in out
        first = [f"live-a{i}" for i in range(5)]
        await spawn(settings, runs, first)
        assert sorted(await statuses(runs, first)).count(RunStatus.REJECTED) == 3
        await runtime.until(lambda: runtime.running_count() == 2)
        assert runtime.max_running == 2

        # Lowered while two run: they are not killed; the next request waits for the new cap.
        code, _, err = await cli(data_dir, "config", "set", "MAX_CONCURRENT_SUBAGENTS=1")
        assert code == 0, err
        await spawn(settings, runs, ["live-b0"])
        assert await statuses(runs, ["live-b0"]) == [RunStatus.REJECTED]
        assert runtime.kills == [] and runtime.running_count() == 2
        await finish_all(runtime, runs, first)

        runtime.max_running = 0
        second = [f"live-c{i}" for i in range(3)]
        await spawn(settings, runs, second)
        assert sorted(await statuses(runs, second)).count(RunStatus.REJECTED) == 2
        assert runtime.max_running == 1
        await finish_all(runtime, runs, second)
        await db.close()

    # A restart with the same environment (cap 3 by default): the live value still holds.
    settings = settings_for(data_dir)
    assert settings.max_concurrent_subagents == 3
    runtime = MemoryRuntime(on_start=_block)
    async with runtime, running_bot(settings, runtime):
        assert settings.max_concurrent_subagents == 1
        code, out, _ = await cli(data_dir, "config", "show")
        assert code == 0
        (line,) = [row for row in out.splitlines() if row.startswith("MAX_CONCURRENT_SUBAGENTS ")]
        assert line.split()[1:] == ["*", "1", "live", "override"]
        db = await Database.open(settings.db_path)
        runs = RunStore(db)
        third = ["live-d0", "live-d1"]
        await spawn(settings, runs, third)
        assert sorted(await statuses(runs, third)).count(RunStatus.REJECTED) == 1
        assert runtime.max_running == 1
        await finish_all(runtime, runs, third)
        changes = await SettingOverrideStore(db).changes(name="MAX_CONCURRENT_SUBAGENTS")
        assert [(c.old_value, c.new_value) for c in changes] == [("3", "2"), ("2", "1")]
        assert all("via control socket" in c.changed_by for c in changes)
        await db.close()


async def test_a_cap_raised_live_starts_the_runs_that_wait_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("crewbot.serve.gc.freeze", lambda: None)  # the test process lives on
    data_dir = tmp_path / "data"
    settings = settings_for(data_dir, queue_limit=10)
    stores = await Stores.open(settings)
    folder = (await stores.chats.ensure(GROUP_ID, "group", "ops")).folder
    await stores.db.close()
    ensure_chat_dirs(DataPaths(data_dir).ipc_root, folder)

    runtime = MemoryRuntime(on_start=_block)
    async with runtime, running_bot(settings, runtime):
        code, _, err = await cli(data_dir, "config", "set", "MAX_CONCURRENT_SUBAGENTS=1")
        assert code == 0, err
        db = await Database.open(settings.db_path)
        runs = RunStore(db)
        ids = [f"wait-{i}" for i in range(3)]
        await spawn_in(folder, settings, runs, ids)
        await runtime.until(lambda: runtime.running_count() == 1)
        assert sorted(await statuses(runs, ids)) == [RunStatus.QUEUED, RunStatus.QUEUED, RunStatus.RUNNING]

        # No run ends: the raise alone starts the two that wait.
        code, _, err = await cli(data_dir, "config", "set", "MAX_CONCURRENT_SUBAGENTS=3")
        assert code == 0, err
        await runtime.until(lambda: runtime.running_count() == 3)
        assert runtime.kills == []
        await finish_all(runtime, runs, ids)
        await db.close()


# Values an attacker's review found accepted, stored and re-applied at every start: no CPU limit, every run
# failing on "cannot convert float infinity to integer", no wall-clock limit, every spawn failing in the engine.
CPUS_RANGE = f"must be a number from 0.01 to {os.cpu_count() or 1} (this host's CPU cores)"  # the bot's machine
SWITCHED_OFF = {
    "SUBAGENT_CPUS=1e-10": CPUS_RANGE,
    "SUBAGENT_CPUS=1e300": CPUS_RANGE,
    "SUBAGENT_TIMEOUT_SECONDS=inf": "must be a number from 0.5 to 86400",
    "SUBAGENT_MEMORY=99999999999999999g": "must be digits with an optional unit b, k, m or g, from 6m to",
    "MAX_CONCURRENT_SUBAGENTS=-1": "must be a whole number from 1 to 100",
}
STORED_BY_AN_OLDER_VERSION = [
    "SUBAGENT_CPUS=1e-10",
    "SUBAGENT_TIMEOUT_SECONDS=inf",
    "SUBAGENT_MEMORY=99999999999999999g",
]


async def test_no_way_in_takes_a_value_that_switches_a_limit_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("crewbot.serve.gc.freeze", lambda: None)  # the test process lives on
    data_dir = tmp_path / "data"
    settings = settings_for(data_dir)
    stores = await Stores.open(settings)
    folder = (await stores.chats.ensure(GROUP_ID, "group", "ops")).folder
    for assignment in STORED_BY_AN_OLDER_VERSION:
        name, value = assignment.split("=")
        await SettingOverrideStore(stores.db).set(now_change(name, None, value, "an older version"))
    await stores.db.close()
    ensure_chat_dirs(DataPaths(data_dir).ipc_root, folder)

    # The environment at start-up: one line naming the variable and its range, and no start.
    started = await asyncio.gather(*(cli(data_dir, "migrate", **dict([a.split("=")])) for a in SWITCHED_OFF))
    for (code, _, err), (assignment, expected) in zip(started, SWITCHED_OFF.items(), strict=True):
        name, value = assignment.split("=")
        assert code == 2 and err.startswith(f"crewbot: cannot start: invalid setting {name}: {expected}"), err
        assert err.strip().endswith(f"(got {value!r})") and len(err.strip().splitlines()) == 1

    # With no bot, `config show` reads the stored ones as the next start would: refused, each named.
    code, out, err = await cli(data_dir, "config", "show")
    assert code == 0, err
    for assignment in STORED_BY_AN_OLDER_VERSION:
        name = assignment.split("=")[0]
        assert f"invalid setting {name}: {SWITCHED_OFF[assignment]}" in err and "is not applied" in err
    live_rows = [row.split() for row in out.splitlines() if row.split()[1:2] == ["*"]]
    shown = {words[0]: words[2] for words in live_rows}
    assert (shown["SUBAGENT_CPUS"], shown["SUBAGENT_TIMEOUT_SECONDS"], shown["SUBAGENT_MEMORY"]) == ("1", "900", "512m")

    runtime = MemoryRuntime(on_start=_block)
    async with runtime, running_bot(settings, runtime):
        # Stored at start: the bot starts on the environment's values, not the stored ones.
        assert (settings.subagent_cpus, settings.subagent_timeout_seconds, settings.subagent_memory) == (
            1.0,
            900.0,
            "512m",
        )
        before = settings.model_dump()
        refused = await asyncio.gather(*(cli(data_dir, "config", "set", a) for a in SWITCHED_OFF))
        for (code, _, err), (assignment, expected) in zip(refused, SWITCHED_OFF.items(), strict=True):
            name, value = assignment.split("=")
            assert code == 1 and err.startswith(f"crewbot: invalid setting {name}: {expected}"), err
            assert err.strip().endswith(f"(got {value!r})")
        assert settings.model_dump() == before

        db = await Database.open(settings.db_path)
        runs = RunStore(db)
        await spawn_in(folder, settings, runs, ["bounded"])
        await runtime.until(lambda: runtime.running_count() == 1)
        (spec,) = runtime.started_specs
        assert (spec.cpus, spec.memory) == (1.0, "512m")
        changes = await SettingOverrideStore(db).changes()
        assert {c.changed_by for c in changes} == {"an older version"}  # no refused value was stored
        await finish_all(runtime, runs, ["bounded"])
        await db.close()
