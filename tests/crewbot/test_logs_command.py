"""`crewbot logs <run id>`: a run's output without `docker logs`; the real command on a real DATA_DIR."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from core.store.chat_files import FileKind
from core.store.chats import ChatStore
from core.store.db import Database
from core.store.outbox import SentFileKind
from core.store.runs import RunStatus, RunStore
from crewbot.logs_command import show_logs
from runner.runtimes.runtime import ContainerSpec
from tests.crewbot.cli_env import crewbot_env, run_crewbot
from tests.egress_helpers import allowed, record, refused
from tests.fakes.memory_runtime import MemoryRuntime
from tests.harness import make_settings
from tests.run_files_helpers import give, send

CHAT = -100


class Screen(io.StringIO):
    """stdout for the command; `until` wakes on each write (no polling)."""

    def __init__(self) -> None:
        super().__init__()
        self._written = asyncio.Event()

    def write(self, text: str) -> int:
        self._written.set()
        return super().write(text)

    async def until(self, text: str) -> None:
        async with asyncio.timeout(5):
            while text not in self.getvalue():
                self._written.clear()
                await self._written.wait()


async def record_run(data_dir: Path, run_id: str, *, finished: bool, container_id: str | None = None) -> RunStore:
    db = await Database.open(data_dir / "crewbot.sqlite3")
    runs = RunStore(db)
    await ChatStore(db).ensure(CHAT, "group", "g")
    await runs.create(
        run_id,
        chat_id=CHAT,
        turn_id=None,
        task="$ make all",
        label="make all",
        include_context=False,
        status=RunStatus.QUEUED,
    )
    await runs.mark_running(run_id, None)
    if container_id is not None:
        await runs.set_container(run_id, container_id)
    if finished:
        await runs.finish(run_id, RunStatus.COMPLETED, result="built")
    await db.close()
    return runs


async def test_a_finished_runs_kept_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    await record_run(data_dir, "abc123def456", finished=True)
    (data_dir / "runs" / "abc123def456").mkdir(parents=True)
    (data_dir / "runs" / "abc123def456" / "container.log").write_bytes(b"compiling\n\x1b[32mok\x1b[0m\n")
    env = crewbot_env(data_dir)

    done = await asyncio.to_thread(run_crewbot, ["logs", "abc123def456"], env, tmp_path)

    assert done.returncode == 0, done.stderr
    heading, *output = done.stdout.splitlines()
    assert heading.startswith("== run abc123def456 (make all): completed, ") and heading.endswith("s ago ==")
    assert output == ["compiling", "ok"]  # the colour codes a hostile task could abuse are gone


async def test_an_unknown_run_is_one_line(tmp_path: Path) -> None:
    await record_run(tmp_path / "data", "abc123def456", finished=True)

    done = await asyncio.to_thread(run_crewbot, ["logs", "nope"], crewbot_env(tmp_path / "data"), tmp_path)

    assert done.returncode != 0
    assert done.stderr.strip() == (
        f"crewbot: no run 'nope' in {tmp_path / 'data' / 'crewbot.sqlite3'}: the chat's /subagents lists run ids"
    )


async def test_follow_prints_new_output_until_the_run_ends(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    async with MemoryRuntime() as runtime:  # no behaviour: the container runs until the test ends it
        spec = ContainerSpec(name="c", image="img", command=[], labels={}, mounts=[], user="1000:1000")
        container_id = await runtime.start(spec)
        runtime.container(container_id).logs = b"step 1\n"
        await record_run(data_dir, "run-f", finished=False, container_id=container_id)
        out = Screen()
        follow = asyncio.create_task(
            show_logs(
                make_settings(data_dir), "run-f", 1000, follow=True, out=out, runtime=runtime, interval_seconds=0.01
            )
        )
        await out.until("step 1")
        runtime.finish(container_id, 0, logs=b"step 2\n")
        await out.until("step 2")
        db = await Database.open(data_dir / "crewbot.sqlite3")
        await RunStore(db).finish("run-f", RunStatus.COMPLETED, result="done")
        await db.close()

        assert await asyncio.wait_for(follow, 5) == 0

    lines = out.getvalue().splitlines()
    assert lines[1:3] == ["step 1", "step 2"]
    assert lines[0].startswith("== run run-f (make all): running for ")
    assert lines[-1].startswith("== run run-f (make all): completed")


async def test_the_files_a_run_was_given_and_sent_follow_the_heading(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    await record_run(data_dir, "run-files", finished=False)
    db = await Database.open(data_dir / "crewbot.sqlite3")
    await give(db, "run-files", CHAT, [("sales.csv", 412 * 1024, FileKind.DOCUMENT)])
    await send(db, "run-files", CHAT, "chart.png", 34 * 1024, SentFileKind.PHOTO, data_dir / "files" / "out" / "x")
    await RunStore(db).finish("run-files", RunStatus.COMPLETED, result="plotted")
    await db.close()
    (data_dir / "runs" / "run-files").mkdir(parents=True)
    (data_dir / "runs" / "run-files" / "container.log").write_bytes(b"plotting\n")
    out = io.StringIO()

    async with MemoryRuntime() as runtime:
        assert await show_logs(make_settings(data_dir), "run-files", 1000, out=out, runtime=runtime) == 0

    heading, *rest = out.getvalue().splitlines()
    assert heading.startswith("== run run-files (make all): completed, ")
    assert rest == ["== Files in: sales.csv (412 KB) ==", "== Files out: chart.png (34 KB, photo) ==", "plotting"]


async def test_a_runs_web_totals_and_last_20_connections_follow_its_files(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    await record_run(data_dir, "run-web", finished=False)
    db = await Database.open(data_dir / "crewbot.sqlite3")
    mirrors = [allowed("run-web", CHAT, f"m{n}.example", 443, "192.0.2.1", down=2048, up=1024) for n in range(23)]
    hostile = "\x1b]0;owned\x07evil.example"
    why = f"{hostile}:443 is not in SUBAGENT_EGRESS_ALLOW\n== run faked: completed =="
    await record(db, "run-web", [*mirrors, refused("run-web", CHAT, hostile, 443, why)])
    await RunStore(db).finish("run-web", RunStatus.COMPLETED, result="fetched")
    await db.close()
    (data_dir / "runs" / "run-web").mkdir(parents=True)
    (data_dir / "runs" / "run-web" / "container.log").write_bytes(b"fetched\n")

    done = await asyncio.to_thread(run_crewbot, ["logs", "run-web"], crewbot_env(data_dir), tmp_path)

    assert done.returncode == 0, done.stderr
    heading, web, *rest = done.stdout.splitlines()
    assert heading.startswith("== run run-web (make all): completed, ")
    assert web == "== Web: 24 connections (1 refused), 46 KB down, 23 KB up; the last 20: =="
    assert rest[:19] == [f"== m{n}.example:443 → 192.0.2.1, 2 KB down, 1 KB up ==" for n in range(4, 23)]
    assert rest[19] == (
        "== ??0?owned?evil.example:443 refused: ]0;owned evil.example:443 is not in SUBAGENT_EGRESS_ALLOW == run "
        "faked: completed == =="
    )  # no terminal escape, and the reason cannot forge a line of its own
    assert rest[20:] == ["fetched"]


async def test_follow_ends_with_the_connections_the_run_made_meanwhile(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    async with MemoryRuntime() as runtime:
        spec = ContainerSpec(name="c", image="img", command=[], labels={}, mounts=[], user="1000:1000")
        container_id = await runtime.start(spec)
        runtime.container(container_id).logs = b"pip install\n"
        await record_run(data_dir, "run-f", finished=False, container_id=container_id)
        out = Screen()
        follow = asyncio.create_task(
            show_logs(
                make_settings(data_dir), "run-f", 1000, follow=True, out=out, runtime=runtime, interval_seconds=0.01
            )
        )
        await out.until("pip install")
        db = await Database.open(data_dir / "crewbot.sqlite3")
        await record(db, "run-f", [allowed("run-f", CHAT, "pypi.org", 443, "151.101.0.223", down=1024 * 1024)])
        runtime.finish(container_id, 0)
        await RunStore(db).finish("run-f", RunStatus.COMPLETED, result="done")
        await db.close()

        assert await asyncio.wait_for(follow, 5) == 0

    lines = out.getvalue().splitlines()
    assert lines[0].startswith("== run run-f (make all): running for ") and lines[1] == "pip install"
    assert lines[-3].startswith("== run run-f (make all): completed")
    assert lines[-2:] == [
        "== Web: 1 connection, 1.0 MB down, 0 bytes up ==",
        "== pypi.org:443 → 151.101.0.223, 1.0 MB down ==",
    ]
