"""The queue survives a SIGKILL: the bot runs as a real process (the crash-recovery rig: fake Telegram,
real engine and image), three requests wait behind one running subagent, the bot is killed and started
again; the survivor is re-attached and the waiting three run after it, one at a time, in their order."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
from pathlib import Path

import pytest

from tests.crewbot.test_crash_recovery import (
    GATED,
    BotProcess,
    bot_env,
    chat_containers,
    query,
    recovery_done,
    release,
    remove_containers,
    texts,
    tg,  # noqa: F401  (the fixture, used by name)
    unique_group_ids,
    until,
)
from tests.fakes.telegram_server import FakeTelegram

pytestmark = pytest.mark.docker


async def test_sigkill_with_requests_waiting_in_the_queue(
    tmp_path: Path,
    tg: FakeTelegram,  # noqa: F811  (the imported fixture)
    subagent_image: str,
) -> None:
    (chat_id,) = unique_group_ids(1)
    tg.add_chat(chat_id, title="queue crash")
    data_dir = tmp_path / "data"
    db = data_dir / "crewbot.sqlite3"
    token = f"q{secrets.token_hex(3)}"
    env = bot_env(tg, data_dir, [chat_id], subagent_image)
    env.update(MAX_CONCURRENT_SUBAGENTS="1", SUBAGENT_QUEUE_LIMIT="10")
    bot = BotProcess(env, tmp_path)
    try:
        bot.start()
        tg.push_message(chat_id, f"@{tg.bot_username} background: $ {GATED}; echo {token}-$((100+0))")
        await until(
            "the first run's first LLM call",
            lambda: query(db, "SELECT 1 FROM subagent_runs WHERE status = 'running' AND llm_requests >= 1"),
            bot,
        )

        def waiting() -> int:
            return len(query(db, "SELECT 1 FROM subagent_runs WHERE status = 'queued'"))

        for n in (1, 2, 3):  # one at a time, so each is its own turn and its own request
            tg.push_message(chat_id, f"@{tg.bot_username} background: $ echo {token}-$((100+{n}))")
            await until(f"request {n} waiting", lambda: waiting() == n, bot)  # noqa: B023 (awaited here)

        def three_waiting() -> list[sqlite3.Row] | None:
            rows = query(db, "SELECT id, status FROM subagent_runs ORDER BY created_at, rowid")
            return rows if [r["status"] for r in rows] == ["running", "queued", "queued", "queued"] else None

        before = await until("three requests waiting", three_waiting, bot)
        bot.kill()
        bot.start()
        recovered = await until("the restart's recovery", lambda: recovery_done(bot), bot)
        assert (recovered["reattached"], recovered["restarted"]) == (1, 3), recovered
        release(data_dir, [chat_id])

        def results() -> list[str]:
            return [t for t in texts(tg, chat_id) if t.startswith("Crew: [Task:")]

        await until("four results", lambda: len(results()) == 4, bot)
        rows = query(
            db,
            "SELECT id, status, error, created_at, started_at, finished_at FROM subagent_runs ORDER BY started_at",
        )
        assert [r["id"] for r in rows] == [r["id"] for r in before]  # started in the order they came
        statuses = [r["status"] for r in rows]
        if statuses != ["completed"] * 4:  # say why, with the bot's own account of the failed run
            failed = [r for r in rows if r["status"] != "completed"]
            log_lines = bot.log_path.read_text(errors="replace").splitlines()
            told = [line for line in log_lines if any(r["id"] in line for r in failed) or '"error"' in line]
            errors = [(r["id"], r["status"], r["error"]) for r in failed]
            raise AssertionError(f"runs not completed: {errors}\nlog lines about them:\n" + "\n".join(told[-40:]))
        for n in range(4):
            assert len([t for t in results() if f"{token}-{100 + n}" in t]) == 1
        await until("containers removed", lambda: not chat_containers([chat_id]), bot, timeout_seconds=30)
    finally:
        await asyncio.to_thread(bot.stop)
        await asyncio.to_thread(remove_containers, [chat_id])
