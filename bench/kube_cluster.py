"""The cluster as bench/kube.py sees it: a namespace of its own, a watch of its pods stamped on arrival, the
pods' cgroups on this node, and the engine-level samples (a bare Job against crewbot's `KubeRuntime`).

Everything here goes through the official `kubernetes` client; only `KubeRuntime` is crewbot's (with a no-op
bridge: busybox has no agent to bridge to).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from bench.common import ms
from core.setting_runtime import PullPolicy
from runner.kube.job_spec import JobOptions
from runner.kube.kube_calls import JOB_NAME_LABEL, KubeCalls
from runner.kube.kube_runtime import KubeRuntime
from runner.runtimes.runtime import LABEL_APP, LABEL_CHAT_ID, LABEL_INSTANCE, LABEL_RUN_ID, ContainerSpec
from runner.runtimes.runtime import container_name as run_job_name
from tests.fakes.memory_kube import no_bridge

BUSYBOX = "crewbot.local/busybox:1.35"  # built into the kit's node (../shared/kube)
SLEEP_SECONDS = 60  # the bare and crewbot pods' `sleep`: far longer than a sample
WAIT_SECONDS = 90.0  # a guard only: a pod runs in about a second on the kit
API_TIMEOUT_SECONDS = 10.0
WATCH_SLICE_SECONDS = 5  # one watch call; the thread then watches again (and sees a stop within this)
NAMESPACE_READY_SECONDS = 60.0
NAMESPACE_GONE_SECONDS = 90.0
POLL_SECONDS = 0.05
CGROUP_POLL_SECONDS = 0.005
SETTLE_SECONDS = 0.3  # a running pod, before it is killed: the kubelet's status update has settled
CGROUP_ROOTS = ("/sys/fs/cgroup/memory", "/sys/fs/cgroup")  # cgroup v1's memory controller, then v2
QOS_DIRS = ("", "burstable/", "besteffort/")  # the kubelet's cgroupfs layout (runner/kube/pod_usage.py)


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


# --- the pods' watch --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodEvent:
    at: float  # time.perf_counter() when the event reached this process
    kind: str  # ADDED, MODIFIED, DELETED
    name: str
    uid: str
    job: str  # the Job controller's job-name label ("" for none)
    phase: str
    container_id: str  # containerd://<id>, once created ("" before)


class PodEvents:
    """Every change to the namespace's pods, stamped on arrival; read by a daemon thread (the client blocks)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self._core = client.CoreV1Api(api)
        self._namespace = namespace
        self._events: list[PodEvent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._version = ""

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        # Listed before the thread starts: every change from here on is seen.
        listed: Any = await asyncio.to_thread(self._core.list_namespaced_pod, self._namespace)
        self._version = str(listed.metadata.resource_version or "")
        self._thread = threading.Thread(target=self._pump, name="kube-pod-events", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, WATCH_SLICE_SECONDS + API_TIMEOUT_SECONDS)

    def _pump(self) -> None:
        while not self._stop.is_set():
            try:
                stream = watch.Watch().stream(
                    self._core.list_namespaced_pod,
                    self._namespace,
                    resource_version=self._version or None,
                    timeout_seconds=WATCH_SLICE_SECONDS,
                    _request_timeout=WATCH_SLICE_SECONDS + API_TIMEOUT_SECONDS,
                )
                for raw in stream:
                    self._note(raw)
                    if self._stop.is_set():
                        return
            except Exception:
                if self._stop.is_set():
                    return
                with contextlib.suppress(Exception):  # 410: the version expired; list again and go on from there
                    listed: Any = self._core.list_namespaced_pod(self._namespace)
                    self._version = str(listed.metadata.resource_version or "")
                time.sleep(POLL_SECONDS)

    def _note(self, raw: dict[str, Any]) -> None:
        at = time.perf_counter()
        pod = raw["object"]
        if raw.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            raise RuntimeError(f"watch ended: {raw.get('type')}")
        self._version = str(pod.metadata.resource_version or self._version)
        statuses = pod.status.container_statuses or []
        event = PodEvent(
            at=at,
            kind=str(raw["type"]),
            name=str(pod.metadata.name),
            uid=str(pod.metadata.uid),
            job=str((pod.metadata.labels or {}).get(JOB_NAME_LABEL, "")),
            phase=str(pod.status.phase or ""),
            container_id=str(statuses[0].container_id or "") if statuses else "",
        )
        with self._lock:
            self._events.append(event)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._changed.set)

    async def first(
        self, match: Callable[[PodEvent], bool], what: str, timeout_seconds: float = WAIT_SECONDS
    ) -> PodEvent:
        """The first event (ever seen) that matches, waiting for it if there is none yet."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            self._changed.clear()
            with self._lock:
                found = next((event for event in self._events if match(event)), None)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no pod event for {what} within {timeout_seconds:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def seen(self) -> list[PodEvent]:
        with self._lock:
            return list(self._events)

    async def running(self, job: str) -> PodEvent:
        return await self.first(lambda e: e.job == job and e.phase == "Running", f"job {job}'s pod Running")

    async def gone(self, pod: str) -> PodEvent:
        return await self.first(lambda e: e.name == pod and e.kind == "DELETED", f"pod {pod} gone from the API")


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
    """The spec tests/runner/kube/test_kube_runtime.py runs: busybox under every hardening, 64 MiB, half a CPU."""
    run_id = secrets.token_hex(6)
    return ContainerSpec(
        name=run_job_name(run_id),
        image=BUSYBOX,
        command=["-c", f"sleep {SLEEP_SECONDS}"],
        entrypoint=["sh"],
        labels={LABEL_APP: "1", LABEL_RUN_ID: run_id, LABEL_CHAT_ID: str(chat_id), LABEL_INSTANCE: "bench"},
        mounts=[],
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


def leftover_cgroups(events: PodEvents) -> list[str]:
    """Pod cgroup directories still here of any pod the watch saw (there should be none once they are gone)."""
    uids = {event.uid for event in events.seen()}
    return [
        path
        for uid in sorted(uids)
        for root in CGROUP_ROOTS
        for qos in QOS_DIRS
        if os.path.isdir(path := f"{root}/kubepods/{qos}pod{uid}")
    ]
