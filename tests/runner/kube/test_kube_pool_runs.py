"""The warm pool on Kubernetes for real: the bot (real PTB against the fake Telegram, real SQLite) with
SUBAGENT_WARM_POOL on the kit's cluster, the real agent image, its channel bridged over exec streams. A hit runs
a real subagent in a pool member's pod with the chat's workspace synced; the claimed Job is removed after its
run; a member deleted while idle is replaced and never handed out; members an earlier process left are removed
at the start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes import client

from core.settings import Settings
from core.store.runs import RunRecord, RunStore
from crewbot.app import App
from crewbot.serve import ObservedSubagents
from runner.kube.kube_config import KubeTarget
from runner.lifecycle.container_spec import pool_container_spec
from runner.lifecycle.warm_pool import WarmPool
from runner.runtimes.runtime import POOL_NAME_PREFIX
from runner.service import build_runtime
from runner.storage.paths import DataPaths
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, telegram_app
from tests.runner.kube.polling import until, until_async
from tests.runner.kube.test_kube_subagents import RUN_WAIT_SECONDS, kube_settings
from tests.runner.test_egress_e2e import PAGE, fetch, run_result

pytestmark = pytest.mark.kubernetes


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


def pool_of(app: App) -> WarmPool:
    assert isinstance(app.subagents, ObservedSubagents)
    pool = app.subagents.service.pool
    assert pool is not None, "SUBAGENT_WARM_POOL made no pool on Kubernetes"
    return pool


async def ready_members(pool: WarmPool) -> list[str] | None:
    """The ready members' Jobs, once the pool is full."""
    members = [m.container_id for m in pool._members.ready() if m.container_id]
    return members if len(members) >= pool.target else None


def jobs(target: KubeTarget, prefix: str = POOL_NAME_PREFIX) -> list[str]:
    batch = client.BatchV1Api(target.api)
    found = batch.list_namespaced_job(target.namespace, label_selector="crewbot=1").items
    names = [str(job.metadata.name) for job in found if job.metadata is not None]
    return [name for name in names if name.startswith(prefix)]


def results(tg: FakeTelegram) -> list[str]:
    return [m.plain_text for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text]


async def one_result(tg: FakeTelegram, count: int) -> str:
    return (await tg.wait_until(lambda: results(tg)[count - 1 :] or None, timeout_seconds=RUN_WAIT_SECONDS))[0]


async def latest_run(app: App) -> RunRecord:
    (record, *_) = await RunStore(app.stores.db).for_chat(GROUP_ID, 10)
    return record


def pooled_settings(tmp_path: Path, tg: FakeTelegram, target: KubeTarget, size: int) -> Settings:
    return kube_settings(tmp_path, tg, target, SUBAGENT_WARM_POOL=size)


async def test_a_pool_hit_runs_a_real_subagent_with_its_chats_workspace_and_its_job_goes_after(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget
) -> None:
    settings = pooled_settings(tmp_path, tg, kube_target, 1)
    async with telegram_app(settings, with_subagents=True) as app:
        pool = pool_of(app)
        (member,) = await until_async(lambda: ready_members(pool))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ echo kept-in-the-chat > notes.txt; hostname")
        text = await one_result(tg, 1)
        first = await latest_run(app)
        assert first.status == "completed" and first.container_id == member  # the member's Job ran the run
        assert member in text  # the pod's hostname: the member's pod, not a new one
        await until(lambda: member not in jobs(kube_target))  # one run per pod: removed after its run
        (second_member,) = await until_async(lambda: ready_members(pool))  # refilled in the background
        assert second_member != member
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ cat notes.txt; hostname")
        text = await one_result(tg, 2)
        second = await latest_run(app)
        assert second.container_id == second_member and second_member in text
        assert "kept-in-the-chat" in text  # the chat's workspace reached a pod that belonged to no chat
        assert pool.counts()[2] == 2  # two hits


async def test_a_member_deleted_while_idle_is_replaced_and_never_handed_out(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget
) -> None:
    settings = pooled_settings(tmp_path, tg, kube_target, 1)
    async with telegram_app(settings, with_subagents=True) as app:
        pool = pool_of(app)
        (member,) = await until_async(lambda: ready_members(pool))
        batch = client.BatchV1Api(kube_target.api)
        await asyncio.to_thread(
            batch.delete_namespaced_job, member, kube_target.namespace, propagation_policy="Background"
        )
        (replacement,) = await until_async(
            lambda: asyncio.sleep(0, [m for m in (pool._members.ready()) if m.container_id != member] or None)
        )
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ hostname")
        text = await one_result(tg, 1)
        record = await latest_run(app)
        assert record.status == "completed" and record.container_id == replacement.container_id
        assert member not in text


async def test_members_an_earlier_process_left_are_removed_at_the_start(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget
) -> None:
    settings = pooled_settings(tmp_path, tg, kube_target, 0)
    paths = DataPaths(settings.data_dir)
    runtime = await asyncio.to_thread(build_runtime, settings)
    left = paths.pool_channel_dir("0123456789ab")
    left.mkdir(parents=True)
    spec = pool_container_spec(
        settings,
        member_id="0123456789ab",
        instance_id=paths.instance_id,
        channel_dir=left,
        workspace=paths.pool_scratch("0123456789ab"),
        image_id="sha256:0123456789abcdef",
    )
    job = await runtime.start(spec)  # an earlier process's member, never claimed
    await runtime.close()
    assert job in await asyncio.to_thread(jobs, kube_target)
    async with telegram_app(settings, with_subagents=True):
        await until(lambda: job not in jobs(kube_target), timeout_seconds=RUN_WAIT_SECONDS)


async def test_the_web_door_reaches_a_pooled_pod_claimed_before_its_run_had_a_door(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget, web_site: tuple[int, int]
) -> None:
    allowed, other = web_site
    settings = kube_settings(
        tmp_path,
        tg,
        kube_target,
        SUBAGENT_WARM_POOL=1,
        SUBAGENT_EGRESS="allowlist",
        SUBAGENT_EGRESS_ALLOW=f"127.0.0.1:{allowed}",
    )
    async with telegram_app(settings, with_subagents=True) as app:
        (member,) = await until_async(lambda: ready_members(pool_of(app)))
        text = await run_result(
            tg, f"{fetch(f'http://127.0.0.1:{allowed}/hello')}\n{fetch(f'http://127.0.0.1:{other}/hello')}"
        )
        assert (await latest_run(app)).container_id == member  # a hit
        assert PAGE in text  # through the pod's forwarder, its bridge (repointed at the claim) and the run's door
        assert f"127.0.0.1:{other} is not in SUBAGENT_EGRESS_ALLOW" in text
