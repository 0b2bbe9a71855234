"""A watch of a namespace's pods in a process of its own, each change stamped the moment its line arrives.

The benchmarks' "pod Running" and "pod gone from the API" are when the API server's watch says so. Read in the
benchmark's own process, that stamp waited for the interpreter: the app under test (its event loop, its API
calls' threads deserialising pods) holds the GIL, and the client turned every event into its models before it
could be stamped, so a run's stamp came later than a bare call's for reasons of the observer, not of the run.
Here the child (`python -m bench.kube_watch KUBECONFIG NAMESPACE VERSION`) reads the raw watch stream, stamps each
line with `time.perf_counter()` (CLOCK_MONOTONIC: the same clock in every process) before it parses it, and writes
one JSON line per change; `PodEvents` in the benchmark reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

WAIT_SECONDS = 90.0  # a guard only: a pod runs in about a second on the kit
API_TIMEOUT_SECONDS = 10.0
WATCH_SLICE_SECONDS = 30  # one watch call; the child then watches again from the last version
RETRY_SECONDS = 0.05
READY_SECONDS = 30.0  # the child's first list (the client's import takes about a second)
STOP_SECONDS = 5.0
JOB_NAME_LABEL = "job-name"  # runner/kube/kube_calls.py's: set by the Job controller on its pods
READY_LINE = "ready"
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class PodEvent:
    at: float  # time.perf_counter() when the event's line reached the watching process
    kind: str  # ADDED, MODIFIED, DELETED
    name: str
    uid: str
    job: str  # the Job controller's job-name label ("" for none)
    phase: str
    container_id: str  # containerd://<id>, once created ("" before)


def _event(at: float, kind: str, pod: dict[str, Any]) -> PodEvent:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    return PodEvent(
        at=at,
        kind=kind,
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        job=str((meta.get("labels") or {}).get(JOB_NAME_LABEL, "")),
        phase=str(status.get("phase", "")),
        container_id=str(statuses[0].get("containerID") or "") if statuses else "",
    )


# --- the child ----------------------------------------------------------------------------------------------


def _watch(kubeconfig: str, namespace: str, version: str) -> None:
    from kubernetes import client, config
    from kubernetes.watch.watch import iter_resp_lines

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration, persist_config=False)
    core = client.CoreV1Api(client.ApiClient(configuration))

    def listed() -> str:
        raw: Any = core.list_namespaced_pod(namespace, _preload_content=False, _request_timeout=API_TIMEOUT_SECONDS)
        return str(json.loads(raw.data)["metadata"].get("resourceVersion", ""))

    version = version or listed()
    print(READY_LINE, flush=True)
    while True:
        try:
            response = core.list_namespaced_pod(
                namespace,
                watch=True,
                resource_version=version,
                timeout_seconds=WATCH_SLICE_SECONDS,
                _preload_content=False,
                _request_timeout=WATCH_SLICE_SECONDS + API_TIMEOUT_SECONDS,
            )
            for line in iter_resp_lines(response):
                at = time.perf_counter()
                raw = json.loads(line)
                pod = raw.get("object") or {}
                if raw.get("type") not in ("ADDED", "MODIFIED", "DELETED"):  # ERROR: the version expired (410)
                    version = listed()
                    break
                version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
                print(json.dumps(asdict(_event(at, str(raw["type"]), pod))), flush=True)
        except Exception as exc:
            print(f"watch failed, again: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            time.sleep(RETRY_SECONDS)


# --- the benchmark's side -----------------------------------------------------------------------------------


class PodEvents:
    """Every change to the namespace's pods from the moment it is entered, stamped by the watching child."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        self._kubeconfig = kubeconfig
        self._namespace = namespace
        self._events: list[PodEvent] = []
        self._changed = asyncio.Event()
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.kube_watch",
            self._kubeconfig,
            self._namespace,
            "",
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self._process.stdout is not None
        try:
            ready = await asyncio.wait_for(self._process.stdout.readline(), READY_SECONDS)
        except TimeoutError:
            ready = b""
        if ready.decode().strip() != READY_LINE:
            await self._stop()
            raise RuntimeError(f"the pod watch of namespace {self._namespace} did not start")
        self._reader = asyncio.create_task(self._read(self._process.stdout), name="kube-pod-events")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()  # our own child, by its pid
            try:
                await asyncio.wait_for(process.wait(), STOP_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            self._events.append(PodEvent(**json.loads(line)))
            self._changed.set()

    async def first(
        self, match: Callable[[PodEvent], bool], what: str, timeout_seconds: float = WAIT_SECONDS
    ) -> PodEvent:
        """The first event (ever seen) that matches, waiting for it if there is none yet."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            self._changed.clear()
            found = next((event for event in self._events if match(event)), None)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no pod event for {what} within {timeout_seconds:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def seen(self) -> list[PodEvent]:
        return list(self._events)

    async def running(self, job: str) -> PodEvent:
        return await self.first(lambda e: e.job == job and e.phase == "Running", f"job {job}'s pod Running")

    async def gone(self, pod: str) -> PodEvent:
        return await self.first(lambda e: e.name == pod and e.kind == "DELETED", f"pod {pod} gone from the API")


if __name__ == "__main__":
    _watch(*sys.argv[1:4])
