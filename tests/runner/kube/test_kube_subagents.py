"""Subagents as Jobs for real: the bot (real PTB against the fake Telegram, real SQLite) on the Kubernetes
backend against a real cluster, the real agent image, its channel bridged over exec streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from pydantic_ai.models.function import FunctionModel

from core.settings import Settings
from core.store.messages import MessageStore
from core.store.runs import RunRecord, RunStore
from runner.kube.kube_config import KubeTarget
from runner.runtimes.runtime import LABEL_CHAT_ID
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app
from tests.runner.kube.conftest import KUBECONFIG_FOR_TESTS
from tests.runner.kube.polling import until, until_async
from tests.runner.test_abort_on_merge import SpawningModel
from tests.runner.test_egress_e2e import PAGE, fetch, run_result

pytestmark = pytest.mark.kubernetes

RUN_WAIT_SECONDS = 120.0  # a guard: a pod starts in about a second here, the agent's Python in one more


def kube_settings(tmp_path: Path, tg: FakeTelegram, target: KubeTarget, **overrides: Any) -> Settings:
    return make_settings(
        tmp_path,
        tg,
        SUBAGENT_RUNTIME="kubernetes",
        KUBECONFIG=KUBECONFIG_FOR_TESTS,
        KUBE_NAMESPACE=target.namespace,
        KUBE_IMAGE_PULL_POLICY="Never",  # the kit pulls nothing: `make test-kubernetes` loads the image
        **overrides,
    )


def chat_jobs(target: KubeTarget, chat_id: int) -> list[Any]:
    """The chat's Jobs (by the annotation: a negative chat id is no label value)."""
    batch = client.BatchV1Api(target.api)
    jobs: list[Any] = batch.list_namespaced_job(target.namespace, label_selector="crewbot=1").items
    return [
        job
        for job in jobs
        if f'"{LABEL_CHAT_ID}": "{chat_id}"' in (job.metadata.annotations or {}).get("crewbot/labels", "")
    ]


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


async def test_a_subagent_job_reports_its_result_to_the_chat_once(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget
) -> None:
    settings = kube_settings(tmp_path, tg, kube_target)
    async with telegram_app(settings, with_subagents=True) as app:
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ echo crunched $((6 * 7)) in $(hostname)")

        def result_message() -> Any:
            return next((m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None)

        result = await tg.wait_until(result_message, timeout_seconds=RUN_WAIT_SECONDS)
        assert "crunched 42 in crewbot-run-" in result.plain_text  # the pod's hostname: it ran in the Job
        (record,) = await RunStore(app.stores.db).for_chat(GROUP_ID, 10)
        assert record.status == "completed" and record.container_id == f"crewbot-run-{record.id}"
        assert record.llm_requests >= 2
        stored = [m for m in await MessageStore(app.stores.db).recent(GROUP_ID, 20) if m.kind == "subagent"]
        assert len(stored) == 1
        await until(lambda: not chat_jobs(kube_target, GROUP_ID))  # deleted once its outcome was recorded
        assert (settings.data_dir / "runs" / record.id / "container.log").read_text()
        sent = [m.plain_text for m in tg.sent_messages(GROUP_ID) if "crunched 42 in" in m.plain_text]
        assert len(sent) == 1


def job_pods(target: KubeTarget, job: str) -> list[Any]:
    core = client.CoreV1Api(target.api)
    return list(core.list_namespaced_pod(target.namespace, label_selector=f"job-name={job}").items)


async def test_a_merge_kills_the_runs_pod_at_once(tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget) -> None:
    model = SpawningModel()
    tg.add_chat(GROUP_ID, title="merge on kubernetes")
    settings = kube_settings(tmp_path, tg, kube_target, MERGE_WINDOW_SECONDS=60)
    async with telegram_app(settings, model=FunctionModel(model), with_subagents=True) as app:
        runs = RunStore(app.stores.db)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: hold\n$ echo working; sleep 300")

        async def running() -> RunRecord | None:
            records = [r for r in await runs.for_chat(GROUP_ID, 10) if r.status == "running" and r.container_id]
            return records[0] if records and records[0].llm_requests >= 1 else None

        record = await until_async(running)
        job = record.container_id
        assert job is not None
        assert [pod.status.phase for pod in await asyncio.to_thread(job_pods, kube_target, job)] == ["Running"]
        tg.push_message(GROUP_ID, f"@{tg.bot_username} oh, and check the logs too")
        await until(lambda: not job_pods(kube_target, job), timeout_seconds=30)
        await until(lambda: not chat_jobs(kube_target, GROUP_ID), timeout_seconds=30)
        cancelled = await runs.get(record.id)
        assert cancelled is not None and cancelled.status == "cancelled"
        answer = await tg.wait_for_messages(GROUP_ID, 1)
        assert answer[0].plain_text.startswith("Crew: plain answer")
        assert not any("[Task:" in m.plain_text for m in tg.sent_messages(GROUP_ID))
        await app.typing.wait_idle(GROUP_ID)


async def test_a_pod_reaches_nothing_but_its_own_channel(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget
) -> None:
    host, port = kube_target.server.removeprefix("https://").rsplit(":", 1)

    def reach(name: str, address: str, to: str) -> str:
        return (
            f"(timeout 3 bash -c 'exec 3<>/dev/tcp/{address}/{to}' 2>/dev/null && echo {name}-open || echo {name}-shut)"
        )

    checks = " ; ".join(
        [
            "echo token=$(ls /var/run/secrets/kubernetes.io 2>/dev/null | wc -l)",
            # Kubernetes adds KUBERNETES_SERVICE_* to every pod (an address, not a secret; unreachable, below).
            "echo envsecrets=$(env | grep -v ^KUBERNETES_ | grep -ci -e token -e secret -e key -e kube)",
            "echo uid=$(id -u)",
            reach("api", host, port),  # the API server, on the node's loopback
            reach("service", "10.240.0.1", "443"),  # the cluster's kubernetes Service
            reach("outside", "1.1.1.1", "443"),
            "echo sockets=$(ls /crewbot/channel)",
        ]
    )
    settings = kube_settings(tmp_path, tg, kube_target)
    async with telegram_app(settings, with_subagents=True):
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ {checks}")

        def result_message() -> Any:
            return next((m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text), None)

        text = (await tg.wait_until(result_message, timeout_seconds=RUN_WAIT_SECONDS)).plain_text
        assert "token=0" in text and "envsecrets=0" in text and "uid=1000" in text
        assert "api-shut" in text and "service-shut" in text and "outside-shut" in text
        assert "sockets=run.sock" in text  # its own channel, and nothing else (no door: egress is off)
        await until(lambda: not chat_jobs(kube_target, GROUP_ID))


async def test_runs_of_a_chat_see_the_files_an_earlier_run_left(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget
) -> None:
    settings = kube_settings(tmp_path, tg, kube_target)
    async with telegram_app(settings, with_subagents=True):
        tg.push_message(
            GROUP_ID,
            f"@{tg.bot_username} background: $ mkdir -p notes && echo kept-between-runs > notes/a.txt"
            " && ln -s notes/a.txt link",
        )
        await tg.wait_until(
            lambda: [m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text] or None,
            timeout_seconds=RUN_WAIT_SECONDS,  # a pod's start and its run: more than the default on a loaded node
        )
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ cat notes/a.txt; readlink link")

        def second_result() -> Any:
            results = [m for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text]
            return results[1] if len(results) > 1 else None

        text = (await tg.wait_until(second_result, timeout_seconds=RUN_WAIT_SECONDS)).plain_text
        assert "kept-between-runs" in text and "notes/a.txt" in text
        tg.push_message(GROUP_ID, "/workspace")
        reply = await tg.wait_until(
            lambda: next(
                (m for m in tg.sent_messages(GROUP_ID) if "workspace" in m.plain_text and "uses" in m.plain_text), None
            )
        )
        assert "(1 entries)" in reply.plain_text  # on this backend: the chat's archive, measured as one file


async def test_the_web_door_reaches_a_pod_over_its_bridge(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget, web_site: tuple[int, int]
) -> None:
    allowed, other = web_site
    settings = kube_settings(
        tmp_path, tg, kube_target, SUBAGENT_EGRESS="allowlist", SUBAGENT_EGRESS_ALLOW=f"127.0.0.1:{allowed}"
    )
    async with telegram_app(settings, with_subagents=True):
        text = await run_result(
            tg, f"{fetch(f'http://127.0.0.1:{allowed}/hello')}\n{fetch(f'http://127.0.0.1:{other}/hello')}"
        )
        assert PAGE in text  # through the pod's forwarder, its bridge, and the host's door
        assert f"127.0.0.1:{other} is not in SUBAGENT_EGRESS_ALLOW" in text


async def test_two_runs_of_a_chat_at_once_both_keep_their_files(
    tmp_path: Path, tg: FakeTelegram, kube_target: KubeTarget
) -> None:
    """Both pods pull the chat's (empty) archive before either pushes: the later push is stale, puts its files on
    the earlier one's in its pod and pushes again (review N2: it used to replace them)."""
    settings = kube_settings(tmp_path, tg, kube_target)
    async with telegram_app(settings, with_subagents=True) as app:
        runs = RunStore(app.stores.db)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ echo one > one.txt; sleep 20; echo first-done")

        async def running() -> list[RunRecord] | None:
            return [r for r in await runs.for_chat(GROUP_ID, 10) if r.status == "running"] or None

        await until_async(running)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ echo two > two.txt; sleep 45; echo second-done")

        def results(count: int) -> list[str] | None:
            found = [m.plain_text for m in tg.sent_messages(GROUP_ID) if "[Task:" in m.plain_text]
            return found if len(found) >= count else None

        both = await tg.wait_until(lambda: results(2), timeout_seconds=RUN_WAIT_SECONDS)
        assert all("-done" in text and "not saved" not in text for text in both), both
        assert "first-done" in both[0] and "second-done" in both[1]  # the second pushed last: it was the stale one
        tg.push_message(GROUP_ID, f"@{tg.bot_username} background: $ cat one.txt two.txt")
        third = (await tg.wait_until(lambda: results(3), timeout_seconds=RUN_WAIT_SECONDS))[2]
        assert "one" in third and "two" in third, third
