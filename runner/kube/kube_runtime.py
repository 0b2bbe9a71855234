"""`ContainerRuntime` on Kubernetes: one `batch/v1` Job per run, its pod's channel bridged over the API.

A run's id on this backend is its Job's name. The pod is found by the Job controller's `job-name` label;
there is one (backoffLimit 0, restartPolicy Never). Once it runs, the runtime starts the run's bridge (an exec
stream into the pod, runner/kube/pod_bridge.py) towards the run's host sockets in its channel folder, so the
host's handlers serve the pod as they serve a Docker container; the bridge lives until the run is killed,
exits or is removed, and a re-attached run (after a restart) gets a new one.

Cancel is immediate: the Job is deleted and then its running pod (grace 0), the Job's delete answered first so
its controller makes no replacement pod; the deletes' answers are left unparsed.
The official client is synchronous: every call runs in the runtime's own threads, and waiting is a watch of the
job's pods in slices, so a thread never outlives `close()` by more than a slice.

A warm pool member (LABEL_POOL) is a Job like a run's. Its bridge comes up as soon as its pod runs, towards the
member's folder, where the pool listens and the idle agent's task request waits; `claim()` points it at the run's
channel folder (the member's, renamed). A claim is then one host-side call, no exec to open. A member left
idle for POOL_IDLE_LIMIT_SECONDS is retired (killed: its waiter sees it end and the pool makes a fresh one), so its
Job's deadline never ends a run. After a restart a claimed member is re-attached by `claim()` again.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

from container.contract import CHANNEL_DIR, ID_PATTERN
from core.logging import get_logger
from runner.kube.job_bridges import BridgeFactory, JobBridges
from runner.kube.job_spec import POOL_IDLE_LIMIT_SECONDS, JobOptions, job_body, kube_labels, run_labels
from runner.kube.kube_calls import JobView, PodView
from runner.kube.pod_usage import pod_sample
from runner.runtimes.resource_use import ResourceSample
from runner.runtimes.runtime import (
    LABEL_POOL,
    LABEL_RUN_ID,
    ContainerGone,
    ContainerInfo,
    ContainerSpec,
    ContainerStartError,
    RuntimeUnavailable,
    container_name,
)

T = TypeVar("T")
log = get_logger(__name__)

WAIT_SLICE_SECONDS = 20  # one watch of a job's pods; the server ends it then and the loop looks again
# While a Job has no pod yet, its controller's refusals (events, which the pods' watch does not see) are looked
# for this often: a missing runtime class or a full quota fails the run instead of waiting for its deadline.
NO_POD_SLICE_SECONDS = 2
SIGKILL_EXIT_CODE = 137  # as Docker reports a killed container: the runtime killed it
START_FAILED_EXIT_CODE = 125  # as Docker's run does for a container that could not start
# Waiting reasons no retry fixes on this pod: the run fails with the reason instead of waiting for its deadline.
FATAL_WAITING_REASONS = frozenset(
    {
        "ErrImageNeverPull",
        "InvalidImageName",
        "ErrImagePull",
        "ImagePullBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
RUN_ID_SHAPE = re.compile(ID_PATTERN)
BRIDGE_RETRY_SECONDS = 1.0  # the pod's state is asked again this soon when the API server did not answer
ENDED_PHASES = frozenset({"Succeeded", "Failed"})


class KubeApi(Protocol):
    """runner/kube/kube_calls.py's `KubeCalls`, or its in-memory twin in the tests."""

    namespace: str

    def ping(self) -> None: ...
    def missing_permissions(self) -> list[str]: ...
    def create_job(self, body: dict[str, object]) -> bool: ...
    def read_job(self, name: str) -> JobView | None: ...
    def list_jobs(self, selector: str) -> list[JobView]: ...
    def delete_job(self, name: str) -> None: ...
    def job_pods(self, job_name: str) -> tuple[list[PodView], str]: ...
    def pod_refusal(self, job_name: str) -> str | None: ...
    def delete_pod_now(self, name: str) -> None: ...
    def pod_log(self, name: str) -> bytes: ...
    def watch_job_pods(self, job_name: str, timeout_seconds: int, since: str) -> Iterator[PodView]: ...
    def close(self) -> None: ...


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(kube_labels(labels).items()))


def _status(job: JobView, pod: PodView | None) -> tuple[str, int | None]:
    """Docker's words for what recovery decides by: running (re-attach), exited (collect), dead (discard)."""
    if pod is not None and pod.exit_code is not None:
        return "exited", pod.exit_code
    if pod is not None and pod.waiting_reason in FATAL_WAITING_REASONS:
        return "dead", None
    if job.failed_reason is not None or job.complete or (pod is not None and pod.deleting):
        return "dead", None
    return "running", None  # scheduled, starting or running: it goes on, and its bridge is made again


class KubeRuntime:
    def __init__(
        self,
        api: KubeApi,
        *,
        max_concurrency: int,
        options: Callable[[], JobOptions],
        bridges: BridgeFactory,
        channel_dir: Callable[[str], Path],
        wait_slice_seconds: int = WAIT_SLICE_SECONDS,
        server: str = "the cluster",
        pool_idle_seconds: float = POOL_IDLE_LIMIT_SECONDS,  # at most that: the Job's deadline allows for it
    ) -> None:
        self._api = api
        self._server = server
        self._options = options  # read at each start: SUBAGENT_TIMEOUT_SECONDS and the quota are live
        self._bridges = JobBridges(bridges, until_running=self._until_running, pod=self._pod)
        self._channel_dir = channel_dir
        self._wait_slice_seconds = wait_slice_seconds
        self._pool_idle_seconds = min(pool_idle_seconds, POOL_IDLE_LIMIT_SECONDS)
        self._executor = ThreadPoolExecutor(max_workers=2 * max_concurrency + 8, thread_name_prefix="kube-runtime")
        self._killed: set[str] = set()
        self._notes: dict[str, str] = {}  # why a pod could not start, for its logs
        self._identities: dict[str, tuple[str, str]] = {}  # a running pod's uid and container id, by job
        self._retirements: dict[str, asyncio.Task[None]] = {}  # an idle pool member's end, cancelled by its claim
        # By image name: what the nodes ran for its first pod this process saw running, and for its latest.
        self._first_image_ids: dict[str, str] = {}
        self._image_ids: dict[str, str] = {}
        self._member_images: dict[str, tuple[str, str]] = {}  # a pool member's pod's image: (name, the node's id)
        self._closed = False

    @property
    def namespace(self) -> str:
        return self._api.namespace

    @property
    def endpoint(self) -> str:
        """Where runs go, for the logs, the console's intro and doctor."""
        return f"Kubernetes at {self._server}, namespace {self.namespace}"

    async def _run(self, call: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise RuntimeUnavailable("the Kubernetes runtime is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, call, *args)
        except RuntimeError as exc:
            if self._closed:  # "cannot schedule new futures after shutdown"
                raise RuntimeUnavailable("the Kubernetes runtime is closed") from exc
            raise

    async def _pod(self, job: str) -> PodView | None:
        return (await self._pod_at(job))[0]

    async def _pod_at(self, job: str) -> tuple[PodView | None, str]:
        """The job's pod (one not being deleted first) and the version a watch for its next change starts at."""
        pods, version = await self._run(self._api.job_pods, job)
        live = [pod for pod in pods if not pod.deleting] or pods
        return (live[0] if live else None), version

    async def missing_permissions(self) -> list[str]:
        """What the bot's account may not do of what runs need (`verb resource`), for doctor."""
        return await self._run(self._api.missing_permissions)

    # -- ContainerRuntime -------------------------------------------------------------------------

    async def ping(self) -> None:
        await self._run(self._api.ping)

    async def start(self, spec: ContainerSpec) -> str:
        body = job_body(spec, self._options())
        try:
            created = await self._run(self._api.create_job, body)
        except RuntimeUnavailable:
            raise
        except Exception as exc:
            raise ContainerStartError(f"the cluster refused Job {spec.name!r}: {exc}") from exc
        if not created:
            raise ContainerStartError(f"a Job named {spec.name!r} exists already in namespace {self.namespace}")
        pooled = LABEL_POOL in spec.labels
        if pooled:
            self._retirements[spec.name] = asyncio.create_task(self._retire_idle(spec.name), name=f"retire-{spec.name}")
        channel = next((mount.source for mount in spec.mounts if mount.target == CHANNEL_DIR), None)
        if channel is not None:
            self._bridges.ensure(spec.name, channel, pooled=pooled)
        return spec.name

    async def claim(self, container_id: str, channel_dir: Path) -> None:
        """The pool member's bridge carries its streams to `channel_dir`'s sockets from now on; after a restart,
        its bridge is made again towards them. Raises ContainerGone for a member this runtime retired."""
        if container_id in self._killed:
            raise ContainerGone(f"pool member {container_id} was retired")
        image, own = self._member_images.pop(container_id, ("", ""))
        newest = self._image_ids.get(image)
        if own and newest is not None and own != newest:  # its node ran another image than the newest pod's
            raise ContainerStartError(f"pool member {container_id} runs image {own}, not the newest seen ({newest})")
        retirement = self._retirements.pop(container_id, None)
        if retirement is not None:
            retirement.cancel()
        await self._bridges.claim(container_id, channel_dir)

    async def _retire_idle(self, job: str) -> None:
        await asyncio.sleep(self._pool_idle_seconds)
        self._retirements.pop(job, None)
        log.info("kube_pool_member_retired", job=job, idle_seconds=self._pool_idle_seconds)
        try:
            await self.kill(job)
        except Exception as exc:  # the API server away: its Job's own deadline ends it instead
            log.warning("kube_pool_member_not_retired", job=job, error=str(exc))

    async def image_id(self, image: str) -> str | None:
        """Which image a pod of `image` runs, for the pool's fingerprint. The nodes' images are not the bot's to
        list (a namespaced Role), so it is what the nodes report for the pods it starts: the name stands for the
        image its first pod ran (members made before any pod ran stay good), and once a later pod runs another
        one (an image rebuilt and loaded under the same tag, a new pull), that one's id, which drains the pool."""
        latest = self._image_ids.get(image)
        return image if latest is None or latest == self._first_image_ids.get(image) else latest

    async def _until_running(self, job: str) -> PodView | None:
        while True:
            try:
                pod, version = await self._pod_at(job)
                if pod is not None and pod.phase == "Running" and pod.exit_code is None:
                    if pod.image_id is not None and pod.image is not None:
                        self._first_image_ids.setdefault(pod.image, pod.image_id)
                        self._image_ids[pod.image] = pod.image_id
                        if job in self._retirements:  # an idle pool member: its own image, checked at its claim
                            self._member_images[job] = (pod.image, pod.image_id)
                    return pod
                if pod is not None and (pod.exit_code is not None or pod.phase in ("Succeeded", "Failed")):
                    return None
                await self._run(self._watch_slice, job, self._wait_slice_seconds, version)
            except Exception as exc:  # the API server away or refusing: the run's time limit bounds the wait
                log.warning("kube_pod_state_unknown_before_bridge", job=job, error=str(exc))
                await asyncio.sleep(BRIDGE_RETRY_SECONDS)

    def _watch_slice(self, job: str, seconds: int, since: str) -> None:
        """Returns at the first change of the job's pods after version `since`, or after `seconds`."""
        for _change in self._api.watch_job_pods(job, seconds, since):
            return

    async def _reattach_bridge(self, job: str) -> None:
        if job in self._bridges or job in self._killed:
            return
        view = await self._run(self._api.read_job, job)
        run_id = run_labels(view.annotations, view.labels).get(LABEL_RUN_ID) if view is not None else None
        # The run id names a host folder: only one the Job's own name agrees with (never a path from the cluster).
        if run_id and RUN_ID_SHAPE.fullmatch(run_id) and container_name(run_id) == job:
            self._bridges.ensure(job, self._channel_dir(run_id))

    async def wait(self, container_id: str, timeout_seconds: float | None = None) -> int | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_seconds is None else loop.time() + timeout_seconds
        await self._reattach_bridge(container_id)
        while True:
            code, version, no_pod = await self._exit_code(container_id)
            if code is not None:
                await self._bridges.stop(container_id)
                return code
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            seconds = NO_POD_SLICE_SECONDS if no_pod else self._wait_slice_seconds
            if remaining is not None:
                seconds = max(1, min(seconds, int(remaining) + 1))
            await self._run(self._watch_slice, container_id, seconds, version)

    async def _exit_code(self, job: str) -> tuple[int | None, str, bool]:
        """Its exit code (None while it runs), the version to watch from, and whether it has no pod yet."""
        pod, version = await self._pod_at(job)
        return await self._code_of(job, pod), version, pod is None

    async def _code_of(self, job: str, pod: PodView | None) -> int | None:
        """Its exit code once it ended; None while it runs; ContainerGone once neither Job nor pod is left."""
        if pod is not None and pod.exit_code is not None:
            return pod.exit_code
        if pod is not None and pod.waiting_reason in FATAL_WAITING_REASONS:
            self._notes[job] = f"crewbot: the pod could not start: {pod.waiting_reason}: {pod.waiting_message or ''}\n"
            log.warning("kube_pod_could_not_start", job=job, reason=pod.waiting_reason, detail=pod.waiting_message)
            await self._run(self._api.delete_job, job)
            await self._run(self._api.delete_pod_now, pod.name)
            return START_FAILED_EXIT_CODE
        if job in self._killed:
            return SIGKILL_EXIT_CODE if pod is None or pod.deleting else None
        if pod is not None and pod.phase in ENDED_PHASES:  # ended with no container status: evicted, say
            self._notes[job] = f"crewbot: the pod ended without an exit code: {pod.ended_why or pod.phase}\n"
            raise ContainerGone(f"the pod of Job {job} ended without an exit code ({pod.ended_why or pod.phase})")
        if pod is None and (refusal := await self._run(self._api.pod_refusal, job)) is not None:
            self._notes[job] = f"crewbot: the cluster made no pod for the run: {refusal}\n"
            log.warning("kube_job_made_no_pod", job=job, reason=refusal)  # a pool member's too: its refill pauses
            await self._run(self._api.delete_job, job)
            return START_FAILED_EXIT_CODE
        if pod is None or pod.deleting:
            view = await self._run(self._api.read_job, job)
            if view is None or view.failed_reason is not None or pod is not None:
                raise ContainerGone(f"Job {job} or its pod was deleted outside crewbot; its exit code is unknown")
        return None

    async def kill(self, container_id: str) -> None:
        """The Job is deleted, then the pod its bridge found running (grace 0; the garbage collector deletes it
        too, the Job's own). The Job's delete is answered first: a pod deleted while its Job lives is replaced
        by the Job's controller, a new pod started on the node in the middle of the cancel (on the kit: 16 of 18
        cancels with the pod's delete sent first, 7 of 22 with both at once; docs/performance.md). A run whose
        pod was never seen running has its pods listed after the Job is gone. The bridge is stopped last."""
        self._killed.add(container_id)
        known = self._bridges.running_pod(container_id)
        await self._run(self._api.delete_job, container_id)
        if known is not None:
            await self._run(self._api.delete_pod_now, known)
        else:
            pods, _ = await self._run(self._api.job_pods, container_id)
            for pod in pods:
                await self._run(self._api.delete_pod_now, pod.name)
        await self._bridges.stop(container_id)

    async def logs(self, container_id: str) -> bytes:
        note = self._notes.get(container_id, "").encode()
        pod = await self._pod(container_id)
        output = await self._run(self._api.pod_log, pod.name) if pod is not None else b""
        return output + note

    async def remove(self, container_id: str) -> None:
        await self._bridges.forget(container_id)
        await self._run(self._api.delete_job, container_id)
        self._forget(container_id)

    def _forget(self, job: str) -> None:
        self._notes.pop(job, None)
        self._identities.pop(job, None)
        self._member_images.pop(job, None)
        self._killed.discard(job)
        retirement = self._retirements.pop(job, None)
        if retirement is not None:
            retirement.cancel()

    async def list(self, labels: dict[str, str]) -> list[ContainerInfo]:
        infos: list[ContainerInfo] = []
        for job in await self._run(self._api.list_jobs, _selector(labels)):
            given = run_labels(job.annotations, job.labels)
            if any(given.get(key) != value for key, value in labels.items()):
                continue
            pod = await self._pod(job.name)
            status, exit_code = _status(job, pod)
            started = pod.started_at if pod is not None else None
            infos.append(ContainerInfo(job.name, job.name, given, status, exit_code, started))
        return infos

    async def usage(self, container_id: str) -> ResourceSample | None:
        """From the pod's cgroup on this machine. Its uid and container id are asked of the API once: the
        supervisor samples every second, and a cgroup gone (it exited) or never here (another node) is None."""
        identity = self._identities.get(container_id)
        if identity is None:
            pod = await self._pod(container_id)
            if pod is None or pod.container_id is None or pod.exit_code is not None:
                return None
            identity = self._identities[container_id] = (pod.uid, pod.container_id)
        return await self._run(pod_sample, *identity)

    async def image_exists(self, image: str) -> bool:
        """The nodes' images are not the bot's to list (a namespaced Role): a missing one fails its run with
        the kubelet's reason (ErrImageNeverPull, ImagePullBackOff) instead."""
        return True

    async def close(self) -> None:
        for retirement in self._retirements.values():
            retirement.cancel()
        await self._bridges.close()
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self._api.close)
