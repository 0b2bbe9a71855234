"""The cluster as the Kubernetes benchmarks see it: KUBECONFIG and a namespace of their own (`bench_cluster`), the
pods' cgroups on this node, and the engine-level samples (a bare Job against crewbot's `KubeRuntime`). The pods'
watch, stamped in a process of its own, is bench/kube_watch.py.

Everything here goes through the official `kubernetes` client; only `KubeRuntime` is crewbot's (with a no-op
bridge: busybox has no agent to bridge to).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from bench.common import BenchContext, ms
from bench.kube_watch import PodEvent, PodEvents
from container.contract import CHANNEL_DIR
from core.setting_runtime import PullPolicy
from runner.kube.job_spec import JobOptions
from runner.kube.kube_calls import KubeCalls
from runner.kube.kube_runtime import KubeRuntime
from runner.runtimes.runtime import LABEL_APP, LABEL_CHAT_ID, LABEL_INSTANCE, LABEL_RUN_ID, ContainerSpec, Mount
from runner.runtimes.runtime import container_name as run_job_name
from tests.fakes.memory_kube import no_bridge

BUSYBOX = "crewbot.local/busybox:1.35"  # built into the kit's node (../shared/kube)
SLEEP_SECONDS = 60  # the bare and crewbot pods' `sleep`: far longer than a sample
WAIT_SECONDS = 90.0  # a guard only: a pod runs in about a second on the kit
API_TIMEOUT_SECONDS = 10.0
NAMESPACE_READY_SECONDS = 60.0
NAMESPACE_GONE_SECONDS = 90.0
POLL_SECONDS = 0.05
CGROUP_POLL_SECONDS = 0.005
SETTLE_SECONDS = 0.3  # a running pod, before it is killed: the kubelet's status update has settled
CGROUP_ROOTS = ("/sys/fs/cgroup/memory", "/sys/fs/cgroup")  # cgroup v1's memory controller, then v2
QOS_DIRS = ("", "burstable/", "besteffort/")  # the kubelet's cgroupfs layout (runner/kube/pod_usage.py)


@dataclass(frozen=True, slots=True)
class BenchCluster:
    kubeconfig: str
    api: client.ApiClient
    namespace: str  # made for this benchmark, deleted with all that is in it at the end


@contextlib.asynccontextmanager
async def bench_cluster(ctx: BenchContext) -> AsyncIterator[BenchCluster | None]:
    """The cluster at KUBECONFIG with a fresh namespace; None (and a note saying why) when there is none to use.
    At the end the namespace goes with everything in it, and whatever was still there is noted."""
    kubeconfig = os.environ.get("KUBECONFIG", "")
    if not kubeconfig:
        ctx.note("skipped: KUBECONFIG is not set (export KUBECONFIG=$(bash ../shared/kube/up.sh | tail -n1))")
        yield None
        return
    if (reason := await asyncio.to_thread(cluster_answers, kubeconfig)) is not None:
        ctx.note(f"skipped: {reason}")
        yield None
        return
    api = await asyncio.to_thread(api_client, kubeconfig)
    try:
        namespace = await asyncio.to_thread(create_namespace, api)
        try:
            yield BenchCluster(kubeconfig, api, namespace)
        finally:
            left = await asyncio.to_thread(delete_namespace, api, namespace)
            if left:
                ctx.note(f"still there at the end, deleted with namespace {namespace}: {', '.join(left)}")
    finally:
        api.close()


def api_client(kubeconfig: str) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration, persist_config=False)
    return client.ApiClient(configuration)


def cluster_answers(kubeconfig: str) -> str | None:
    """None when the API server at KUBECONFIG answers; else why not, in a line."""
    try:
        api = api_client(kubeconfig)
    except Exception as exc:
        return f"cannot load KUBECONFIG={kubeconfig}: {exc}"
    try:
        client.CoreV1Api(api).list_namespace(limit=1, _request_timeout=API_TIMEOUT_SECONDS)
    except Exception as exc:
        return f"the cluster at KUBECONFIG={kubeconfig} does not answer: {type(exc).__name__}: {exc}"
    finally:
        api.close()
    return None


def has_runtime_class(api: client.ApiClient, name: str) -> bool:
    try:
        client.NodeV1Api(api).read_runtime_class(name, _request_timeout=API_TIMEOUT_SECONDS)
    except ApiException:
        return False
    return True


def create_namespace(api: client.ApiClient) -> str:
    """A fresh namespace, once pods may be made in it (its default service account exists)."""
    core = client.CoreV1Api(api)
    name = f"crewbot-bench-{secrets.token_hex(4)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + NAMESPACE_READY_SECONDS
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            return name
        except ApiException:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"namespace {name} got no default service account in {NAMESPACE_READY_SECONDS:g} s"
                ) from None
            time.sleep(POLL_SECONDS)


def delete_namespace(api: client.ApiClient, name: str) -> list[str]:
    """Its Jobs and pods at once (grace 0), then the namespace; waits until it is gone. Returns what was left."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    jobs: Any = batch.list_namespaced_job(name)
    pods: Any = core.list_namespaced_pod(name)
    left = [f"job {job.metadata.name}" for job in jobs.items] + [f"pod {pod.metadata.name}" for pod in pods.items]
    with contextlib.suppress(ApiException):
        batch.delete_collection_namespaced_job(name, propagation_policy="Background", grace_period_seconds=0)
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name, grace_period_seconds=0, propagation_policy="Background")
    deadline = time.monotonic() + NAMESPACE_GONE_SECONDS
    while time.monotonic() < deadline:
        try:
            core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return left
        time.sleep(POLL_SECONDS * 4)
    return [*left, f"namespace {name} still there after {NAMESPACE_GONE_SECONDS:g} s"]


# --- the pods' cgroups on this node --------------------------------------------------------------------------


def container_cgroup(event: PodEvent) -> Path | None:
    """The running container's cgroup directory here (cgroupfs driver), or None (another node, another layout)."""
    _, _, container_id = event.container_id.rpartition("://")
    if not container_id:
        return None
    for root in CGROUP_ROOTS:
        for qos in QOS_DIRS:
            path = Path(f"{root}/kubepods/{qos}pod{event.uid}/{container_id}")
            if path.is_dir():
                return path
    return None


def _is_dir(path: Path) -> bool:
    return os.path.isdir(path)  # sysfs: no disk behind it, a stat costs microseconds


async def cgroup_gone(path: Path, timeout_seconds: float = WAIT_SECONDS) -> float:
    """When the directory was first seen gone (perf_counter), looked for every few ms."""
    deadline = time.monotonic() + timeout_seconds
    while _is_dir(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"cgroup {path} still there after {timeout_seconds:g} s")
        await asyncio.sleep(CGROUP_POLL_SECONDS)
    return time.perf_counter()


# --- engine-level samples: a bare Job, and crewbot's KubeRuntime ------------------------------------------------


def bare_job_body(name: str) -> dict[str, Any]:
    """The least a Job needs: busybox sleeping, never pulled, never retried."""
    container = {"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["sleep", str(SLEEP_SECONDS)]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}},
    }


def busybox_spec(chat_id: int) -> ContainerSpec:
    """The spec tests/runner/kube/test_kube_runtime.py runs: busybox under every hardening, 64 MiB, half a CPU.
    With a run's channel folder, as the product's runs have: the runtime's (no-op) bridge waits for the pod to run,
    so a kill takes the product's path (the pod the bridge found running deleted at once, no list first)."""
    run_id = secrets.token_hex(6)
    return ContainerSpec(
        name=run_job_name(run_id),
        image=BUSYBOX,
        command=["-c", f"sleep {SLEEP_SECONDS}"],
        entrypoint=["sh"],
        labels={LABEL_APP: "1", LABEL_RUN_ID: run_id, LABEL_CHAT_ID: str(chat_id), LABEL_INSTANCE: "bench"},
        mounts=[Mount(Path("/nonexistent"), CHANNEL_DIR)],  # an emptyDir in the pod; no host folder is used
        user="1000:1000",
        memory="64m",
        cpus=0.5,
    )


def bench_runtime(api: client.ApiClient, namespace: str) -> KubeRuntime:
    options = JobOptions(
        namespace=namespace, pull_policy=PullPolicy.NEVER, ttl_seconds=600, deadline_seconds=120, workspace_quota_mb=16
    )
    calls = KubeCalls(client.ApiClient(api.configuration), namespace)
    return KubeRuntime(
        calls, max_concurrency=4, options=lambda: options, bridges=no_bridge, channel_dir=lambda run_id: Path("/none")
    )


@dataclass(slots=True)
class EngineSample:
    """ms from the first call: start returned, pod Running; kill returned, pod gone, container's cgroup gone."""

    started: float
    running: float
    killed: float
    gone: float
    cgroup_gone: float | None  # None: the container's cgroup is not on this node


async def _stopped(events: PodEvents, running: PodEvent, cgroup: Path | None, t0: float) -> tuple[float, float | None]:
    gone = await events.gone(running.name)
    cgroup_at = await cgroup_gone(cgroup) if cgroup is not None else None
    return ms(gone.at - t0), (ms(cgroup_at - t0) if cgroup_at is not None else None)


async def bare_sample(api: client.ApiClient, namespace: str, events: PodEvents) -> EngineSample:
    """Create a minimal Job → its pod Running; then (its Job removed, the pod orphaned) delete the pod, grace 0."""
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    name = f"bare-{secrets.token_hex(4)}"
    body: Any = bare_job_body(name)
    t0 = time.perf_counter()
    await asyncio.to_thread(batch.create_namespaced_job, namespace, body)
    t_created = time.perf_counter()
    running = await events.running(name)
    cgroup = container_cgroup(running)
    # Not timed: the Job goes first with its pod orphaned, so no controller replaces the pod deleted below.
    await asyncio.to_thread(batch.delete_namespaced_job, name, namespace, propagation_policy="Orphan")
    await asyncio.to_thread(_until_job_gone, batch, namespace, name)
    await asyncio.sleep(SETTLE_SECONDS)
    t_kill = time.perf_counter()
    await asyncio.to_thread(core.delete_namespaced_pod, running.name, namespace, grace_period_seconds=0)
    t_killed = time.perf_counter()
    gone, cgroup_at = await _stopped(events, running, cgroup, t_kill)
    return EngineSample(ms(t_created - t0), ms(running.at - t0), ms(t_killed - t_kill), gone, cgroup_at)


def _until_job_gone(batch: client.BatchV1Api, namespace: str, name: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            batch.read_namespaced_job(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(POLL_SECONDS)
    raise TimeoutError(f"Job {name} still there {WAIT_SECONDS:g} s after its deletion")


async def runtime_sample(runtime: KubeRuntime, events: PodEvents, chat_id: int) -> EngineSample:
    """crewbot's `KubeRuntime.start` of the busybox spec → its pod Running; `kill` → pod gone, cgroup gone."""
    spec = busybox_spec(chat_id)
    t0 = time.perf_counter()
    job = await runtime.start(spec)
    t_started = time.perf_counter()
    try:
        running = await events.running(job)
        cgroup = container_cgroup(running)
        await asyncio.sleep(SETTLE_SECONDS)
        t_kill = time.perf_counter()
        await runtime.kill(job)
        t_killed = time.perf_counter()
        gone, cgroup_at = await _stopped(events, running, cgroup, t_kill)
    finally:
        await runtime.remove(job)
    return EngineSample(ms(t_started - t0), ms(running.at - t0), ms(t_killed - t_kill), gone, cgroup_at)


def leftover_cgroups(seen: list[PodEvent]) -> list[str]:
    """Pod cgroup directories still here of any pod the watch saw (there should be none once they are gone)."""
    uids = {event.uid for event in seen}
    return [
        path
        for uid in sorted(uids)
        for root in CGROUP_ROOTS
        for qos in QOS_DIRS
        if os.path.isdir(path := f"{root}/kubepods/{qos}pod{uid}")
    ]
