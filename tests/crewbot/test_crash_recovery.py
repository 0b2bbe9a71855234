"""Whole-process crash recovery: the bot runs as a real subprocess (`python -m crewbot run`) against the fake
Telegram on a thread, the real engine and image, and is SIGKILLed at the worst moments, then started
again with the same settings. Nothing is lost and nothing is sent twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import docker
import pytest

from core.settings import without_settings
from core.store.chats import folder_for_chat
from runner.runtimes.runtime import LABEL_CHAT_ID
from tests.fakes.faults import Fault
from tests.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.docker

RUN_WAIT_SECONDS = 120.0  # containers start slowly on a loaded 2-core machine
STOP_WAIT_SECONDS = 30.0
STARTED = "Crew: Started subagent run "
# A run that must still be going when the bot dies waits for this file in its chat's workspace (a bind mount
# of DATA_DIR/workspaces/<folder>) instead of sleeping: the test lets it end once the next start re-attached it.
GATE_FILE = "release-the-run"
GATED = f"until [ -e {GATE_FILE} ]; do sleep 0.1; done"


def unique_group_ids(count: int) -> list[int]:
    base = 2_000_000_000 + secrets.randbelow(900_000_000)
    return [-(base + n) for n in range(count)]


class BotProcess:
    """`python -m crewbot run` with a fixed environment; stdout and stderr go to one log file across starts."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self._env = env
        self._workdir = workdir
        self.log_path = workdir / "bot.log"
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self._log = self.log_path.open("ab")
        self.starts += 1
        self._log.write(f"--- start {self.starts} ---\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "crewbot", "run"],
            env=self._env,
            cwd=self._workdir,  # no stray .env is read
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        assert self.proc is not None and self.proc.poll() is None, f"the bot is not running; see {self.log_path}"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(STOP_WAIT_SECONDS)
        self._close_log()

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL if it hangs); only our own process, by its pid."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_WAIT_SECONDS)
        self._close_log()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def bot_env(tg: FakeTelegram, data_dir: Path, chats: list[int], image: str) -> dict[str, str]:
    """The process environment minus any crewbot setting of the operator's, plus this test's settings."""
    env = without_settings(os.environ)
    env.update(
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.base_url,
        DATA_DIR=str(data_dir),
        ALLOWED_CHAT_IDS=",".join(map(str, chats)),
        LLM_PROVIDER="offline",
        MERGE_WINDOW_SECONDS="0",
        TYPING_INTERVAL_SECONDS="0.5",
        LOG_FORMAT="json",
        LOG_LEVEL="INFO",
        SUBAGENT_IMAGE=image,
        STATUS_CARD="false",  # these tests inject faults into the next sendMessage: the result's, not a card's
        STREAM_REPLIES="false",  # whole answers, as these tests count them (streamed: tests/bot/agent/)
        # The gate (release()) is a file the test writes into the chat's bind-mounted workspace folder: with a warm
        # pool a run's /workspace is its own scratch folder (tests/runner/lifecycle/test_warm_pool.py covers the
        # pool across a restart).
        SUBAGENT_WARM_POOL="0",
    )
    return env


def query(db_path: Path, sql: str, *args: Any) -> list[sqlite3.Row]:
    """A short read of the bot's database while it runs (WAL: readers do not block the writer)."""
    if not db_path.exists():
        return []
    conn = sqlite3.connect(db_path, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # migrations not applied yet
            return []
        raise
    finally:
        conn.close()


async def until(what: str, check: Callable[[], Any], bot: BotProcess, timeout_seconds: float = RUN_WAIT_SECONDS) -> Any:
    """Poll `check` (truthy result wins) while the bot lives; fail with the bot's log tail otherwise."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        result = await asyncio.to_thread(check)
        if result:
            return result
        if not bot.alive() or time.monotonic() > deadline:
            state = "exited" if not bot.alive() else "still running"
            log_text = bot.log_path.read_text(errors="replace")
            # The spawn decisions first (they explain a run that never came), then the log's end.
            spawns = "\n".join(line for line in log_text.splitlines() if '"spawn_' in line)
            raise AssertionError(
                f"timed out waiting for {what} (bot {state}); spawn events:\n{spawns}\nlog tail:\n{log_text[-4000:]}"
            )
        await asyncio.sleep(0.1)


def chat_containers(chats: list[int]) -> list[Any]:
    client = docker.from_env()
    try:
        found: list[Any] = []
        for chat_id in chats:
            filters = {"label": f"{LABEL_CHAT_ID}={chat_id}"}
            found += client.containers.list(all=True, sparse=True, filters=filters)
        return found
    finally:
        client.close()


def release(data_dir: Path, chats: list[int]) -> None:
    """Let the chats' GATED runs go on."""
    for chat_id in chats:
        (data_dir / "workspaces" / folder_for_chat(chat_id) / GATE_FILE).touch()


def recovery_done(bot: BotProcess) -> dict[str, Any] | None:
    """The recovery_done event (its counts) of the bot's latest start, once it has logged it."""
    latest = bot.log_path.read_text(errors="replace").rsplit(f"--- start {bot.starts} ---", 1)[-1]
    for line in latest.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and event.get("event") == "recovery_done":
                return event
    return None


def remove_containers(chats: list[int]) -> None:
    for container in chat_containers(chats):
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.remove(force=True)


@pytest.fixture
def tg() -> Iterator[FakeTelegram]:
    with FakeTelegram() as fake:  # on its own thread: the bot is another process
        yield fake


def texts(tg: FakeTelegram, chat_id: int) -> list[str]:
    return [m.plain_text for m in tg.sent_messages(chat_id)]


async def test_sigkill_while_three_subagents_run(tmp_path: Path, tg: FakeTelegram, subagent_image: str) -> None:
    chats = unique_group_ids(3)
    for chat_id in chats:
        tg.add_chat(chat_id, title=f"crash {chat_id}")
    data_dir = tmp_path / "data"
    db = data_dir / "crewbot.sqlite3"
    token = f"res{secrets.token_hex(3)}"
    # Each output `token-10n` appears only in the run's result, never in the task, label or start reply.
    outputs = {chat_id: f"{token}-{100 + n}" for n, chat_id in enumerate(chats)}
    bot = BotProcess(bot_env(tg, data_dir, chats, subagent_image), tmp_path)
    try:
        bot.start()
        # Held at the gate: all three are mid-run together however slowly containers start.
        for n, chat_id in enumerate(chats):
            tg.push_message(chat_id, f"@{tg.bot_username} background: $ {GATED}; echo {token}-$((100+{n}))")

        def all_mid_run() -> list[sqlite3.Row] | None:
            rows = query(db, "SELECT id, chat_id, status, llm_requests, container_id FROM subagent_runs")
            ready = [r for r in rows if r["status"] == "running" and r["llm_requests"] >= 1 and r["container_id"]]
            return rows if len(rows) == 3 and len(ready) == 3 else None

        before = await until("three runs past their first LLM call", all_mid_run, bot)
        bot.kill()
        bot.start()
        recovered = await until("the restart's recovery", lambda: recovery_done(bot), bot)
        assert recovered["reattached"] == 3, recovered
        release(data_dir, chats)

        def all_results() -> bool:
            return all(any(out in t for t in texts(tg, c)) for c, out in outputs.items())

        await until("every result in its chat", all_results, bot)

        def settled() -> list[sqlite3.Row] | None:
            rows = query(db, "SELECT id, chat_id, status, container_id FROM subagent_runs")
            pending = query(db, "SELECT id FROM outbox WHERE status = 'pending'")
            final = all(r["status"] not in ("queued", "running") for r in rows)
            return rows if final and not pending else None

        after = await until("runs ended and nothing owed", settled, bot)
        assert {r["id"]: r["status"] for r in after} == {r["id"]: "completed" for r in before}
        # Re-attached, not restarted: each run finished in the container it had before the kill.
        assert {r["id"]: r["container_id"] for r in after} == {r["id"]: r["container_id"] for r in before}
        await until("containers removed", lambda: not chat_containers(chats), bot, timeout_seconds=30)
        for chat_id, out in outputs.items():
            sent = texts(tg, chat_id)
            assert len([t for t in sent if out in t]) == 1, sent
            assert len([t for t in sent if t.startswith(STARTED)]) == 1, sent
            assert len([t for t in sent if t.startswith("Crew: [Task:")]) == 1, sent
        assert not query(db, "SELECT id FROM outbox WHERE status != 'sent'")
    finally:
        await asyncio.to_thread(bot.stop)
        await asyncio.to_thread(remove_containers, chats)


async def test_sigkill_between_storing_a_result_and_sending_it(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    (chat_id,) = unique_group_ids(1)
    tg.add_chat(chat_id, title="crash mid-send")
    data_dir = tmp_path / "data"
    db = data_dir / "crewbot.sqlite3"
    output = f"sent{secrets.token_hex(3)}-201"
    task = f"$ sleep 1 && echo {output.rsplit('-', 1)[0]}-$((200+1))"
    bot = BotProcess(bot_env(tg, data_dir, [chat_id], subagent_image), tmp_path)
    try:
        bot.start()
        tg.push_message(chat_id, f"@{tg.bot_username} background: {task}")
        started = await tg.wait_for_messages(chat_id, 1, timeout_seconds=60)
        assert started[0].plain_text.startswith(STARTED)
        tg.fail_next("sendMessage", Fault.hang())  # the next send (the result) never gets an answer

        def result_request() -> bool:
            return any(output in str(call.params.get("text", "")) for call in tg.requests("sendMessage"))

        await until("the result's sendMessage to hang", result_request, bot)
        rows = query(db, "SELECT status, parts_sent FROM outbox WHERE text LIKE ?", f"%{output}%")
        assert [tuple(r) for r in rows] == [("pending", 0)]  # stored, owed, not yet recorded as sent
        bot.kill()
        assert not any(output in t for t in texts(tg, chat_id))
        bot.start()

        await until("the result to be sent", lambda: any(output in t for t in texts(tg, chat_id)), bot)
        await until(
            "its outbox row to be sent",
            lambda: (
                [tuple(r) for r in query(db, "SELECT status FROM outbox WHERE text LIKE ?", f"%{output}%")]
                == [("sent",)]
            ),
            bot,
        )
        await until("the container removed", lambda: not chat_containers([chat_id]), bot, timeout_seconds=30)
        sent = texts(tg, chat_id)
        assert len([t for t in sent if output in t]) == 1, sent
        assert len([t for t in sent if t.startswith(STARTED)]) == 1, sent
        (run,) = query(db, "SELECT status FROM subagent_runs")
        assert run["status"] == "completed"
        assert not query(db, "SELECT id FROM outbox WHERE status != 'sent'")
    finally:
        await asyncio.to_thread(bot.stop)
        await asyncio.to_thread(remove_containers, [chat_id])


async def test_sigterm_stops_cleanly_and_the_next_start_reattaches(
    tmp_path: Path, tg: FakeTelegram, subagent_image: str
) -> None:
    (chat_id,) = unique_group_ids(1)
    tg.add_chat(chat_id, title="graceful stop")
    data_dir = tmp_path / "data"
    db = data_dir / "crewbot.sqlite3"
    output = f"term{secrets.token_hex(3)}"
    bot = BotProcess(bot_env(tg, data_dir, [chat_id], subagent_image), tmp_path)
    try:
        bot.start()
        tg.push_message(chat_id, f"@{tg.bot_username} background: $ {GATED}; echo {output}")
        await until(
            "the run's first LLM call",
            lambda: query(db, "SELECT 1 FROM subagent_runs WHERE status = 'running' AND llm_requests >= 1"),
            bot,
        )
        assert bot.proc is not None
        await asyncio.to_thread(bot.stop)  # SIGTERM
        assert bot.proc.returncode == 0, f"SIGTERM should end it cleanly; see {bot.log_path}"
        # Stopped taking work, wrote what it had, and left the container for the next start.
        assert [c.status for c in chat_containers([chat_id])] == ["running"]
        (run,) = query(db, "SELECT status FROM subagent_runs")
        assert run["status"] == "running"
        bot.start()
        recovered = await until("the restart's recovery", lambda: recovery_done(bot), bot)
        assert recovered["reattached"] == 1, recovered
        release(data_dir, [chat_id])

        def results() -> list[str]:  # the "Started…" reply quotes the command too: count outcomes only
            return [t for t in texts(tg, chat_id) if t.startswith("Crew: [Task:") and output in t]

        await until("the result", results, bot)
        await until("the container removed", lambda: not chat_containers([chat_id]), bot, timeout_seconds=30)
        (result,) = results()
        assert result.endswith(f"{output}\n[exit code: 0]")  # it completed in the container it started in
    finally:
        await asyncio.to_thread(bot.stop)
        await asyncio.to_thread(remove_containers, [chat_id])
