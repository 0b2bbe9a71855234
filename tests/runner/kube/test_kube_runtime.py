"""The Job runtime against a real cluster: Jobs as runs, hardened pods, kill at once, gone is reported,
and gVisor by runtime class (the kit's RuntimeClass `gvisor`). Busybox stands in for the agent here; the
agent's own runs over the bridge are in test_kube_subagents.py."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from container.contract import CHANNEL_DIR, WORKSPACE_DIR
from runner.kube.kube_config import KubeTarget
from runner.kube.kube_runtime import SIGKILL_EXIT_CODE, START_FAILED_EXIT_CODE, KubeRuntime
from runner.runtimes.runtime import (
    LABEL_APP,
    LABEL_CHAT_ID,
    LABEL_INSTANCE,
    LABEL_RUN_ID,
    ContainerGone,
    ContainerSpec,
    Mount,
    container_name,
)
from tests.fakes.memory_kube import no_bridge
from tests.runner.kube.polling import until_async
from tests.runner.kube.runtimes import runtime_on

pytestmark = pytest.mark.kubernetes

BUSYBOX = "crewbot.local/busybox:1.35"  # built into the kit's node
RUN_SECONDS = 60.0  # a guard only: a Job here takes about a second
WATCH_SECONDS = 5  # after a kill: a replacement pod is made within milliseconds of its pod's deletion, if at all


async def has_logged(runtime: KubeRuntime, job: str, text: bytes) -> bool:
    return text in await runtime.logs(job)


async def has_started(runtime: KubeRuntime) -> bool:
    return any(info.started_at is not None for info in await runtime.list({LABEL_APP: "1"}))


async def runtime_lists_none(runtime: KubeRuntime, run_id: str) -> bool:
    return not await runtime.list({LABEL_RUN_ID: run_id})


@pytest.fixture
async def runtime(kube_target: KubeTarget) -> AsyncIterator[KubeRuntime]:
    async with runtime_on(kube_target, bridges=no_bridge, channel_dir=lambda run_id: Path("/none")) as kube:
        yield kube


def spec(script: str, *, runtime_class: str | None = None, image: str = BUSYBOX) -> ContainerSpec:
    run_id = secrets.token_hex(6)
    return ContainerSpec(
        name=container_name(run_id),
        image=image,
        command=["-c", script],
        entrypoint=["sh"],
        labels={LABEL_APP: "1", LABEL_RUN_ID: run_id, LABEL_CHAT_ID: "-1001234", LABEL_INSTANCE: "test"},
        mounts=[],
        user="1000:1000",
        memory="64m",
        cpus=0.5,
        runtime_class=runtime_class,
    )


async def test_a_job_runs_reports_its_exit_code_and_output_and_is_listed_with_its_labels(runtime: KubeRuntime) -> None:
    given = spec("echo hello from the pod; exit 3")
    job = await runtime.start(given)
    async with asyncio.timeout(RUN_SECONDS):
        assert await runtime.wait(job) == 3
    assert b"hello from the pod" in await runtime.logs(job)
    (info,) = [i for i in await runtime.list({LABEL_APP: "1", LABEL_RUN_ID: given.labels[LABEL_RUN_ID]})]
    assert info.labels[LABEL_CHAT_ID] == "-1001234"  # a label value Kubernetes refuses, kept in an annotation
    assert (info.status, info.exit_code) == ("exited", 3)
    await runtime.remove(job)
    async with asyncio.timeout(RUN_SECONDS):
        await until_async(lambda: runtime_lists_none(runtime, given.labels[LABEL_RUN_ID]))


async def test_the_pod_is_hardened_as_the_docker_flags(runtime: KubeRuntime, kube_target: KubeTarget) -> None:
    script = (
        "id -u; id -g; touch /rootfs-write 2>/dev/null && echo root-writable || echo root-read-only; "
        "grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status; "
        "ls /var/run/secrets/kubernetes.io 2>/dev/null || echo no-token; touch /tmp/ok && echo tmp-writable"
    )
    job = await runtime.start(spec(script))
    async with asyncio.timeout(RUN_SECONDS):
        assert await runtime.wait(job) == 0
    out = (await runtime.logs(job)).decode()
    assert out.splitlines()[:2] == ["1000", "1000"]
    assert "root-read-only" in out and "tmp-writable" in out and "no-token" in out
    assert "CapEff:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out
    body: Any = client.BatchV1Api(kube_target.api).read_namespaced_job(job, kube_target.namespace)
    assert body.spec.backoff_limit == 0
    assert body.spec.ttl_seconds_after_finished == 600
    assert body.spec.active_deadline_seconds is not None
    pod_spec = body.spec.template.spec
    assert pod_spec.automount_service_account_token is False
    assert pod_spec.security_context.seccomp_profile.type == "RuntimeDefault"
    limits = pod_spec.containers[0].resources.limits
    assert (limits["memory"], limits["cpu"]) == ("64Mi", "500m")


def pods_seen(core: client.CoreV1Api, namespace: str, job: str, since: str) -> set[str]:
    """Every pod the job had from resourceVersion `since` on, for WATCH_SECONDS (a replacement the garbage
    collector deletes at once is still seen here, where a list afterwards would miss it)."""
    names: set[str] = set()
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        namespace,
        label_selector=f"job-name={job}",
        resource_version=since,
        timeout_seconds=WATCH_SECONDS,
    ):
        names.add(event["object"].metadata.name)
    return names


@pytest.mark.parametrize("bridged", [False, True], ids=["pod-listed", "pod-its-bridge-found"])
async def test_kill_ends_the_pod_at_once_and_no_replacement_comes(
    runtime: KubeRuntime, kube_target: KubeTarget, bridged: bool
) -> None:
    # With a channel folder the runtime's (no-op) bridge finds the pod running and the kill deletes it by name.
    mounts = [Mount(Path("/nonexistent"), CHANNEL_DIR)] if bridged else []
    job = await runtime.start(replace(spec("echo started; sleep 600"), mounts=mounts))
    core = client.CoreV1Api(kube_target.api)
    async with asyncio.timeout(RUN_SECONDS):
        await until_async(lambda: has_logged(runtime, job, b"started"))
        listed: Any = await asyncio.to_thread(
            core.list_namespaced_pod, kube_target.namespace, label_selector=f"job-name={job}"
        )
        original = {pod.metadata.name for pod in listed.items}
        seen = asyncio.ensure_future(
            asyncio.to_thread(pods_seen, core, kube_target.namespace, job, listed.metadata.resource_version)
        )
        await runtime.kill(job)
        assert await runtime.wait(job) == SIGKILL_EXIT_CODE
        # The Job's delete was answered before the pod's: its controller never made a replacement pod.
        assert await seen == original

    def pods() -> list[object]:
        return list(core.list_namespaced_pod(kube_target.namespace, label_selector=f"job-name={job}").items)

    assert await asyncio.to_thread(pods) == []  # deleted with grace 0: gone from the API at once
    batch = client.BatchV1Api(kube_target.api)
    jobs = await asyncio.to_thread(batch.list_namespaced_job, kube_target.namespace, label_selector=f"{LABEL_RUN_ID}")
    names = {item.metadata.name for item in jobs.items if item.metadata and not item.metadata.deletion_timestamp}
    assert job not in names


async def test_a_job_deleted_by_someone_else_is_gone_not_guessed(runtime: KubeRuntime, kube_target: KubeTarget) -> None:
    job = await runtime.start(spec("sleep 600"))
    async with asyncio.timeout(RUN_SECONDS):
        await until_async(lambda: has_started(runtime))
        batch = client.BatchV1Api(kube_target.api)
        await asyncio.to_thread(
            batch.delete_namespaced_job,
            job,
            kube_target.namespace,
            propagation_policy="Background",
            grace_period_seconds=0,
        )
        with pytest.raises(ContainerGone):
            await runtime.wait(job)


async def test_an_image_the_node_does_not_have_fails_the_run_with_the_kubelets_reason(runtime: KubeRuntime) -> None:
    job = await runtime.start(spec("true", image="crewbot.local/not-there:1"))
    async with asyncio.timeout(RUN_SECONDS):
        assert await runtime.wait(job) == START_FAILED_EXIT_CODE
    assert b"ErrImageNeverPull" in await runtime.logs(job)


async def test_usage_is_read_from_the_pods_cgroup_on_this_node(runtime: KubeRuntime) -> None:
    job = await runtime.start(spec("echo started; sleep 600"))
    async with asyncio.timeout(RUN_SECONDS):
        await until_async(lambda: has_logged(runtime, job, b"started"))

        async def peak_bytes() -> int | None:
            sample = await runtime.usage(job)
            return sample.memory_peak_bytes if sample is not None else None

        # The pod's status names its container a moment after its log begins (the API's view lags the kubelet):
        # an early sample may be None (the supervisor skips it); a running pod's must come.
        assert await until_async(peak_bytes) > 0
    await runtime.kill(job)


async def test_a_runtime_class_runs_the_pod_under_gvisor(runtime: KubeRuntime) -> None:
    job = await runtime.start(spec("dmesg; id -u", runtime_class="gvisor"))
    async with asyncio.timeout(RUN_SECONDS):
        assert await runtime.wait(job) == 0
    out = await runtime.logs(job)
    assert b"gVisor" in out and b"1000" in out


async def test_a_pod_evicted_for_filling_its_workspace_ends_its_run_with_the_reason(runtime: KubeRuntime) -> None:
    given = spec("dd if=/dev/zero of=/workspace/fill bs=1M count=120; echo filled; sleep 600")
    given = replace(given, mounts=[Mount(Path("/unused"), WORKSPACE_DIR)])  # an emptyDir of quota + 64 MiB (80 MiB)
    job = await runtime.start(given)
    with pytest.raises(ContainerGone, match=r"Evicted|ephemeral|without an exit code"):
        async with asyncio.timeout(RUN_SECONDS * 2):
            code = await runtime.wait(job)
            raise AssertionError(f"exited with {code} instead of being evicted")  # pragma: no cover
    assert b"ended without an exit code" in await runtime.logs(job)
