"""A SIGKILLed bot on the Kubernetes backend: the bot runs as a real process (`python -m crewbot run`) against
the fake Telegram and a real cluster, is killed while its Jobs run, and started again: each run's Job is
re-attached through a new bridge and its result told once, and a Job deleted meanwhile is reported once."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from runner.kube.kube_config import KubeTarget
from tests.crewbot.test_crash_recovery import STARTED, BotProcess, bot_env, query, texts, unique_group_ids, until
from tests.fakes.telegram_server import FakeTelegram
from tests.runner.kube.conftest import KUBECONFIG_FOR_TESTS

pytestmark = pytest.mark.kubernetes


def kube_env(tg: FakeTelegram, data_dir: Path, chats: list[int], target: KubeTarget) -> dict[str, str]:
    env = bot_env(tg, data_dir, chats, "crewbot-agent:latest")
    scratch = data_dir.parent / "tmp"  # a SIGKILLed bot cannot remove its certificate copies (kube_config)
    scratch.mkdir(parents=True, exist_ok=True)
    env.update(
        TMPDIR=str(scratch),
        SUBAGENT_RUNTIME="kubernetes",
        KUBECONFIG=KUBECONFIG_FOR_TESTS,
        KUBE_NAMESPACE=target.namespace,
        KUBE_IMAGE_PULL_POLICY="Never",
        # Runs started cold, re-attached by their run id; two at 1 CPU fill the kit's node, with no room for a pool.
        SUBAGENT_WARM_POOL="0",
    )
    return env


def instance_jobs(target: KubeTarget) -> list[Any]:
    batch = client.BatchV1Api(target.api)
    jobs: list[Any] = batch.list_namespaced_job(target.namespace, label_selector="crewbot=1").items
    return [job for job in jobs if job.metadata.deletion_timestamp is None]


@pytest.fixture
def tg() -> Any:
    with FakeTelegram() as fake:  # on its own thread: the bot is another process
        yield fake


async def test_sigkill_while_jobs_run_reattaches_each_and_reports_a_deleted_one_once(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget
) -> None:
    survivor, victim = unique_group_ids(2)
    for chat_id in (survivor, victim):
        tg.add_chat(chat_id, title=f"kube crash {chat_id}")
    data_dir = tmp_path / "data"
    db = data_dir / "crewbot.sqlite3"
    token = f"res{secrets.token_hex(3)}"
    bot = BotProcess(kube_env(tg, data_dir, [survivor, victim], kube_target), tmp_path)
    try:
        bot.start()
        tg.push_message(survivor, f"@{tg.bot_username} background: $ sleep 20 && echo {token}-$((40+2))")
        tg.push_message(victim, f"@{tg.bot_username} background: $ sleep 300")

        def both_mid_run() -> list[sqlite3.Row] | None:
            rows = query(db, "SELECT id, chat_id, status, llm_requests, container_id FROM subagent_runs")
            ready = [r for r in rows if r["status"] == "running" and r["llm_requests"] >= 1 and r["container_id"]]
            return rows if len(ready) == 2 else None

        before = await until("both runs past their first LLM call", both_mid_run, bot)
        bot.kill()
        # While the bot is down, someone deletes the victim's Job (and so its pod).
        victim_job = next(r["container_id"] for r in before if r["chat_id"] == victim)
        batch = client.BatchV1Api(kube_target.api)
        await asyncio.to_thread(
            batch.delete_namespaced_job, victim_job, kube_target.namespace, propagation_policy="Background"
        )
        bot.start()

        def survivor_told() -> bool:
            return any(f"{token}-42" in t for t in texts(tg, survivor))

        await until("the survivor's result in its chat", survivor_told, bot)

        def settled() -> list[sqlite3.Row] | None:
            rows = query(db, "SELECT id, chat_id, status, container_id FROM subagent_runs")
            pending = query(db, "SELECT id FROM outbox WHERE status = 'pending'")
            return rows if all(r["status"] not in ("queued", "running") for r in rows) and not pending else None

        after = {r["chat_id"]: r for r in await until("runs ended and nothing owed", settled, bot)}
        survivor_before = next(r for r in before if r["chat_id"] == survivor)
        assert after[survivor]["status"] == "completed"
        assert after[survivor]["container_id"] == survivor_before["container_id"]  # re-attached, not restarted
        assert after[victim]["status"] in ("interrupted", "failed")
        await until("the Jobs deleted", lambda: not instance_jobs(kube_target), bot, timeout_seconds=60)
        sent = texts(tg, survivor)
        assert len([t for t in sent if f"{token}-42" in t]) == 1, sent
        assert len([t for t in sent if t.startswith(STARTED)]) == 1, sent
        told = [t for t in texts(tg, victim) if not t.startswith(STARTED)]
        assert len(told) == 1, told  # the victim's chat hears once what became of its run
    finally:
        await asyncio.to_thread(bot.stop)


async def test_sigkill_during_a_pooled_run_reattaches_its_member_and_drains_the_idle_ones(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget
) -> None:
    (chat,) = unique_group_ids(1)
    tg.add_chat(chat, title=f"kube pool crash {chat}")
    data_dir = tmp_path / "data"
    db = data_dir / "crewbot.sqlite3"
    token = f"res{secrets.token_hex(3)}"
    env = kube_env(tg, data_dir, [chat], kube_target) | {"SUBAGENT_WARM_POOL": "1"}
    bot = BotProcess(env, tmp_path)
    try:
        bot.start()

        def member_ready() -> bool:  # the pool says so in its log (JSON lines)
            return "warm_pool_member_ready" in bot.log_path.read_text(errors="replace")

        await until("a ready pool member", member_ready, bot)
        tg.push_message(chat, f"@{tg.bot_username} background: $ sleep 15 && echo {token}-$((40+2))")

        def pooled_mid_run() -> sqlite3.Row | None:
            rows = query(db, "SELECT id, status, llm_requests, container_id FROM subagent_runs")
            ready = [r for r in rows if r["status"] == "running" and r["llm_requests"] >= 1 and r["container_id"]]
            return ready[0] if ready else None

        before = await until("the run past its first LLM call", pooled_mid_run, bot)
        assert before["container_id"].startswith("crewbot-pool-")  # a hit: the run is in a member's pod
        bot.kill()
        idle_before = {job.metadata.name for job in instance_jobs(kube_target)} - {before["container_id"]}
        bot.start()

        def told() -> bool:
            return any(f"{token}-42" in t for t in texts(tg, chat))

        await until("the pooled run's result in its chat", told, bot)

        def settled() -> sqlite3.Row | None:
            (row,) = query(db, "SELECT status, container_id FROM subagent_runs")
            return row if row["status"] not in ("queued", "running") else None

        after = await until("the run ended", settled, bot)
        assert after["status"] == "completed" and after["container_id"] == before["container_id"]  # re-attached

        def members_replaced() -> bool:
            names = {job.metadata.name for job in instance_jobs(kube_target)}
            return before["container_id"] not in names and not names & idle_before  # claimed gone, idle drained

        await until("the claimed Job removed and the earlier process's idle members drained", members_replaced, bot)
        assert len([t for t in texts(tg, chat) if f"{token}-42" in t]) == 1
    finally:
        await asyncio.to_thread(bot.stop)
