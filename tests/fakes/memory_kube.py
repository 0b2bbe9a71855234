"""A fake Kubernetes API for the Job runtime's fast tests: Jobs and pods kept by a `MemoryRuntime`.

`KubeRuntime` (the real one) runs over `MemoryKube` as it runs over `KubeCalls`: each Job is one of the memory
runtime's containers (its pod), named as the Job, so the lifecycle scenarios run on this backend with the same
behaviours, faults (engine away, kills refused) and assertions as on the Docker one. The API's calls come from
the runtime's worker threads and are answered on the test's event loop. The pod's channel is not bridged here
(a behaviour talks to the host socket as on Docker); the real bridge has its own tests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from container.contract import CHANNEL_DIR
from runner.kube.job_spec import LABELS_ANNOTATION, kube_labels, run_labels
from runner.kube.kube_calls import JobView, PodView
from runner.runtimes.runtime import (
    LABEL_POOL,
    LABEL_RUN_ID,
    ContainerGone,
    ContainerSpec,
    ContainerStartError,
    Mount,
    RuntimeUnavailable,
)
from runner.storage.paths import POOL_PREFIX
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime

T = TypeVar("T")
POD_SUFFIX = "-pod"
CALL_LIMIT_SECONDS = 30.0  # a worker thread never waits longer for the loop (a test that broke must not hang)


class MemoryKube:
    namespace = "memory"

    def __init__(self, runtime: MemoryRuntime, loop: asyncio.AbstractEventLoop, channel_dir: Any) -> None:
        self.runtime = runtime
        self.bodies: list[dict[str, Any]] = []  # every Job created, as sent
        self._loop = loop
        self._channel_dir = channel_dir  # run id -> the host folder of its sockets
        self._images: dict[str, str] = {}  # a Job's image id, as a node reports it

    def _on_loop(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_LIMIT_SECONDS) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _job(self, name: str) -> MemoryContainer | None:
        live = [c for c in self.runtime._live() if c.name == name]
        return live[-1] if live else None

    async def _exists(self, name: str) -> MemoryContainer | None:
        await self.runtime.ping()  # an API server that is away answers nothing
        return self._job(name)

    def ping(self) -> None:
        self._on_loop(self.runtime.ping())

    def missing_permissions(self) -> list[str]:
        return []

    def create_job(self, body: dict[str, Any]) -> bool:
        metadata = body["metadata"]
        labels = run_labels(metadata["annotations"], metadata["labels"])
        container = body["spec"]["template"]["spec"]["containers"][0]
        # A pool member's folder is beside the runs' (DataPaths.pool_channel_dir), so the same mapping finds it.
        folder = labels[LABEL_RUN_ID] if LABEL_RUN_ID in labels else f"{POOL_PREFIX}{labels[LABEL_POOL]}"
        spec = ContainerSpec(
            name=metadata["name"],
            image=container["image"],
            command=container.get("args", []),
            labels=labels,
            mounts=[Mount(Path(self._channel_dir(folder)), CHANNEL_DIR, read_only=True)],
            user=f"{container['securityContext']['runAsUser']}:{container['securityContext']['runAsGroup']}",
            environment={item["name"]: item["value"] for item in container["env"]},
        )
        self.bodies.append(body)
        self._images[spec.name] = f"sha256:{spec.image}-{self.runtime.image_generation}"  # what its node runs
        try:
            self._on_loop(self.runtime.start(spec))
        except ContainerStartError as exc:
            if "already in use" in str(exc):
                return False
            raise
        return True

    def _view(self, container: MemoryContainer) -> JobView:
        labels = dict(container.labels)
        return JobView(
            name=container.name,
            labels=kube_labels(labels),
            annotations={LABELS_ANNOTATION: json.dumps(labels)},
            failed_reason=None,
            complete=False,
            created_at=container.started_at,
        )

    def read_job(self, name: str) -> JobView | None:
        container = self._on_loop(self._exists(name))
        return self._view(container) if container is not None else None

    def list_jobs(self, selector: str) -> list[JobView]:
        wanted = dict(pair.split("=", 1) for pair in selector.split(",") if pair)
        return [self._view(c) for c in self._on_loop(self._list(wanted))]

    async def _list(self, wanted: dict[str, str]) -> list[MemoryContainer]:
        infos = await self.runtime.list({})
        found = [self.runtime.container(info.id) for info in infos]
        return [c for c in found if all(kube_labels(c.labels).get(k) == v for k, v in wanted.items())]

    def delete_job(self, name: str) -> None:
        self._on_loop(self._delete(name))

    async def _delete(self, name: str) -> None:
        container = await self._exists(name)
        if container is not None:
            await self.runtime.kill(container.id)  # refused as the engine refuses a kill (the test's faults)
            await self.runtime.remove(container.id)

    def job_pods(self, job_name: str) -> tuple[list[PodView], str]:
        container = self._on_loop(self._exists(job_name))
        if container is None:
            return [], ""
        phase = "Running" if container.status == "running" else ("Succeeded" if container.exit_code == 0 else "Failed")
        pod = PodView(
            name=job_name + POD_SUFFIX,
            uid=container.id,
            phase=phase,
            node_name="memory",
            container_id=f"memory://{container.id}",
            started_at=container.started_at,
            exit_code=container.exit_code,
            waiting_reason=None,
            waiting_message=None,
            deleting=False,
            image=container.spec.image if container.spec is not None else None,
            image_id=self._images.get(job_name),
        )
        return [pod], ""

    def pod_refusal(self, job_name: str) -> str | None:
        return None

    def delete_pod_now(self, name: str) -> None:
        self._on_loop(self._delete(name.removesuffix(POD_SUFFIX)))

    def pod_log(self, name: str) -> bytes:
        container = self._on_loop(self._exists(name.removesuffix(POD_SUFFIX)))
        return container.logs if container is not None else b""

    def watch_job_pods(self, job_name: str, timeout_seconds: int, since: str) -> Iterator[PodView]:
        container = self._on_loop(self._exists(job_name))
        if container is None:
            return
        try:
            code = self._on_loop(self.runtime.wait(container.id, timeout_seconds), timeout_seconds + CALL_LIMIT_SECONDS)
        except ContainerGone:
            return
        except RuntimeUnavailable:
            raise
        if code is not None:
            yield from self.job_pods(job_name)[0]

    def close(self) -> None:
        pass


class NoBridge:
    """The pod's channel needs no bridge here: its behaviour reaches the host socket itself."""

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass

    def repoint(self, sockets: Mapping[str, Path | None]) -> None:
        pass


def no_bridge(
    job: str, pod_name: str, sockets: dict[str, Path | None], still_running: object, pooled: bool
) -> NoBridge:
    return NoBridge()
