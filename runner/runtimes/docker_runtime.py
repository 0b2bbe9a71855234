"""`ContainerRuntime` on a Docker engine through the docker SDK, with every blocking call in a thread.

The SDK is synchronous and `wait()` blocks for a container's whole life, so the runtime owns a thread pool
sized for the concurrency cap instead of borrowing the event loop's small default executor. The client is
built lazily inside that pool: building it asks the engine for its API version, which blocks and fails
when the engine is down; a later call retries, so a restarted engine is picked up without a restart here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions
from docker.types import LogConfig
from docker.types import Mount as DockerMount

from runner.runtimes.docker_info import info_from_attrs
from runner.runtimes.resource_use import ResourceSample, cgroup_sample, sample_from_engine_stats
from runner.runtimes.runtime import (
    LABEL_APP,
    ContainerGone,
    ContainerInfo,
    ContainerSpec,
    ContainerStartError,
    RuntimeUnavailable,
)

T = TypeVar("T")

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
TMPFS_MOUNTPOINT = "/tmp"
# Docker adds noexec to a tmpfs unless told `exec`; said here so the engine's record shows it. The tmpfs
# takes the mode of the image's /tmp (1777 in Debian), so any uid can write there.
TMPFS_OPTIONS = "rw,noexec,nosuid,nodev,size=64m"
# json-file keeps `logs()` working whatever the daemon's default driver is; the cap keeps a chatty
# container from filling the host's disk (the oldest output is dropped, the tail is what matters).
LOG_MAX_SIZE = "10m"
API_TIMEOUT_SECONDS = 60.0
# `wait()` is issued in slices so a worker thread never blocks longer than this past `close()` or past
# the caller's deadline; each slice is one cheap HTTP request to the engine.
WAIT_SLICE_SECONDS = 5.0
NANO_CPUS_PER_CPU = 1_000_000_000
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
# An unknown --runtime: "Unknown runtime specified X" (20.10), "unknown or invalid runtime name: X" (later).
_UNKNOWN_RUNTIME_MARKERS = ("unknown runtime", "unknown or invalid runtime")
RUNTIME_CLASS_FIX = (
    "register it with the engine (`make engine` installs gVisor's runsc and adds it to /etc/docker/daemon.json as "
    "runtime `runsc`; then reload the engine: `systemctl reload docker` or SIGHUP dockerd), "
    "or unset SUBAGENT_RUNTIME_CLASS"
)


def security_options(spec: ContainerSpec) -> dict[str, Any]:
    """The hardening and limits every subagent container gets, in one place (keyword args for create)."""
    return {
        "user": spec.user,
        "read_only": True,
        "tmpfs": {TMPFS_MOUNTPOINT: TMPFS_OPTIONS},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": spec.pids,
        "mem_limit": spec.memory,
        # Same as the memory limit: no swap on top of it, so the limit means what it says.
        "memswap_limit": spec.memory,
        "nano_cpus": int(spec.cpus * NANO_CPUS_PER_CPU),
        "network_mode": spec.network,
        # An init process as PID 1 reaps orphans and makes SIGKILL of the tree immediate.
        "init": True,
        # Logs are read after exit; the manager removes the container afterwards.
        "auto_remove": False,
        "privileged": False,
    }


def create_options(spec: ContainerSpec) -> dict[str, Any]:
    """Everything `containers.create` gets for a spec: identity, mounts, environment, and the hardening."""
    mounts = [
        DockerMount(target=mount.target, source=str(mount.source.absolute()), type="bind", read_only=mount.read_only)
        for mount in spec.mounts
    ]
    return {
        "name": spec.name,
        "labels": {LABEL_APP: "1", **spec.labels},
        "mounts": mounts,
        # HOME on the tmpfs: the root filesystem is read-only and tools write dot-files into HOME.
        "environment": {"HOME": TMPFS_MOUNTPOINT, **spec.environment},
        "working_dir": spec.workdir,
        **({"entrypoint": spec.entrypoint} if spec.entrypoint is not None else {}),
        "detach": True,
        # A second kernel boundary (gVisor's runsc); absent, the engine's default runtime (runc).
        **({"runtime": spec.runtime_class} if spec.runtime_class is not None else {}),
        "log_config": LogConfig(type=LogConfig.types.JSON, config={"max-size": LOG_MAX_SIZE, "max-file": "1"}),
        **security_options(spec),
    }


def _is_engine_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, requests.exceptions.ConnectionError | FileNotFoundError | ConnectionRefusedError):
        return True
    return isinstance(exc, docker.errors.DockerException) and "Error while fetching server API version" in str(exc)


class UnknownRuntimeClass(ContainerStartError):
    """The engine has no runtime of SUBAGENT_RUNTIME_CLASS's name; the message says how to register it."""


def _create_refused(spec: ContainerSpec, exc: docker.errors.APIError) -> ContainerStartError:
    """Why create failed, in words an operator can act on; an unknown runtime class names its fix."""
    explanation = str(exc.explanation or exc)
    if spec.runtime_class is not None and any(marker in explanation.lower() for marker in _UNKNOWN_RUNTIME_MARKERS):
        name = spec.runtime_class
        return UnknownRuntimeClass(
            f"the engine has no runtime {name!r} (SUBAGENT_RUNTIME_CLASS={name}); {RUNTIME_CLASS_FIX}"
        )
    return ContainerStartError(f"engine refused to create container {spec.name!r}: {explanation}")


def _status_code(exc: docker.errors.APIError) -> int | None:
    code = exc.status_code
    return int(code) if code is not None else None


class DockerRuntime:
    """Docker implementation of `runner.runtimes.runtime.ContainerRuntime`.

    `base_url` overrides DOCKER_HOST (default: the local socket); TLS settings still come from the
    environment. `max_concurrency` is the subagent cap: the pool gets two threads per container (its
    `wait()` plus a kill, logs or inspect) and a margin for start, list and ping.
    """

    def __init__(
        self,
        max_concurrency: int,
        base_url: str | None = None,
        api_timeout_seconds: float = API_TIMEOUT_SECONDS,
        wait_slice_seconds: float = WAIT_SLICE_SECONDS,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self._environment = dict(os.environ)
        if base_url is not None:
            self._environment["DOCKER_HOST"] = base_url
        self._endpoint = self._environment.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
        self._api_timeout_seconds = api_timeout_seconds
        self._wait_slice_seconds = wait_slice_seconds
        self._max_workers = 2 * max_concurrency + 8
        self._executor = ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="docker-runtime")
        self._client_lock = threading.Lock()
        self._client: docker.DockerClient | None = None
        self._closed = threading.Event()

    @property
    def endpoint(self) -> str:
        return self._endpoint

    # -- plumbing ---------------------------------------------------------------------------------

    def _unavailable(self, exc: BaseException) -> RuntimeUnavailable:
        hint = (
            "start it with `sudo dockerd --bridge=none --iptables=false` (or `systemctl start docker`)"
            if self._endpoint.startswith("unix://")
            else "check that the engine at DOCKER_HOST is up and reachable"
        )
        return RuntimeUnavailable(f"Docker engine not reachable at {self._endpoint}: {exc}; {hint}")

    def _get_client(self) -> docker.DockerClient:
        with self._client_lock:
            if self._closed.is_set():
                raise RuntimeUnavailable("the Docker runtime is closed")
            if self._client is None:
                self._client = docker.DockerClient.from_env(
                    environment=self._environment,
                    use_context=False,
                    timeout=self._api_timeout_seconds,
                    max_pool_size=self._max_workers,
                )
            return self._client

    def _blocking(self, call: Callable[[docker.DockerClient], T]) -> T:
        """Run one SDK interaction in a worker thread, turning "engine unreachable" into RuntimeUnavailable."""
        try:
            return call(self._get_client())
        except RuntimeUnavailable:
            raise
        except Exception as exc:
            if _is_engine_unreachable(exc):
                raise self._unavailable(exc) from exc
            raise

    async def _run(self, call: Callable[[docker.DockerClient], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._blocking, call)
        except RuntimeError as exc:
            if self._closed.is_set():  # "cannot schedule new futures after shutdown"
                raise RuntimeUnavailable("the Docker runtime is closed") from exc
            raise

    # -- ContainerRuntime -------------------------------------------------------------------------

    async def ping(self) -> None:
        def call(client: docker.DockerClient) -> None:
            client.api.ping()

        await self._run(call)

    async def start(self, spec: ContainerSpec) -> str:
        options = create_options(spec)

        def call(client: docker.DockerClient) -> str:
            try:
                container = client.containers.create(spec.image, spec.command, **options)
            except docker.errors.ImageNotFound as exc:
                raise ContainerStartError(
                    f"image {spec.image!r} not found on the engine; build it (crewbot image build) "
                    f"or set SUBAGENT_IMAGE: {exc.explanation or exc}"
                ) from exc
            except docker.errors.APIError as exc:
                raise _create_refused(spec, exc) from exc
            try:
                container.start()
            except docker.errors.APIError as exc:
                # Do not leave a created-but-dead container holding the run's name.
                with contextlib.suppress(docker.errors.APIError):
                    client.api.remove_container(container.id, force=True)
                raise ContainerStartError(
                    f"engine refused to start container {spec.name!r}: {exc.explanation or exc}"
                ) from exc
            return str(container.id)

        return await self._run(call)

    async def wait(self, container_id: str, timeout_seconds: float | None = None) -> int | None:
        """Exit code once it stops, None on time-out; raises ContainerGone if it no longer exists."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_seconds is None else loop.time() + timeout_seconds
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            slice_seconds = self._wait_slice_seconds if remaining is None else min(remaining, self._wait_slice_seconds)
            code = await self._run(
                functools.partial(self._wait_slice, container_id=container_id, slice_seconds=slice_seconds)
            )
            if code is not None:
                return code

    def _wait_slice(self, client: docker.DockerClient, container_id: str, slice_seconds: float) -> int | None:
        if self._closed.is_set():
            raise RuntimeUnavailable("the Docker runtime is closed")
        try:
            result = client.api.wait(container_id, timeout=max(slice_seconds, 0.01))
        except docker.errors.NotFound as exc:
            raise ContainerGone(
                f"container {container_id[:12]} no longer exists (removed outside crewbot?); its exit code is unknown"
            ) from exc
        except requests.exceptions.RequestException:
            # The SDK signals its read time-out as a ConnectionError, the same type as a dead engine:
            # a ping tells them apart (it raises, mapped to RuntimeUnavailable, if the engine is gone).
            client.api.ping()
            return None
        return int(result["StatusCode"])

    async def kill(self, container_id: str) -> None:
        def call(client: docker.DockerClient) -> None:
            try:
                client.api.kill(container_id)  # SIGKILL; never stop(): its grace period is 10 s
            except docker.errors.APIError as exc:
                if _status_code(exc) in {HTTP_NOT_FOUND, HTTP_CONFLICT}:
                    return  # gone, or not running: the outcome the caller wanted
                raise

        await self._run(call)

    async def logs(self, container_id: str) -> bytes:
        def call(client: docker.DockerClient) -> bytes:
            try:
                data = client.api.logs(container_id, stdout=True, stderr=True, stream=False)
            except docker.errors.NotFound:
                return b""
            return bytes(data)

        return await self._run(call)

    async def remove(self, container_id: str) -> None:
        def call(client: docker.DockerClient) -> None:
            try:
                client.api.remove_container(container_id, force=True)
            except docker.errors.APIError as exc:
                # 409: a removal is already in progress.
                if _status_code(exc) in {HTTP_NOT_FOUND, HTTP_CONFLICT}:
                    return
                raise

        await self._run(call)

    async def list(self, labels: dict[str, str]) -> list[ContainerInfo]:
        filters = {"label": [f"{key}={value}" for key, value in labels.items()]}

        def call(client: docker.DockerClient) -> list[ContainerInfo]:
            containers = client.containers.list(all=True, filters=filters, ignore_removed=True)
            return [info_from_attrs(container.attrs) for container in containers]

        return await self._run(call)

    async def inspect(self, container_id: str) -> ContainerInfo | None:
        """One container's state; None if it does not exist."""

        def call(client: docker.DockerClient) -> ContainerInfo | None:
            try:
                return info_from_attrs(client.api.inspect_container(container_id))
            except docker.errors.NotFound:
                return None

        return await self._run(call)

    async def usage(self, container_id: str) -> ResourceSample | None:
        local = self._endpoint.startswith("unix://")  # a remote engine's cgroups are not on this host

        def call(client: docker.DockerClient) -> ResourceSample | None:
            sample = cgroup_sample(container_id) if local else None
            if sample is not None:
                return sample
            try:
                stats = client.api.stats(container_id, stream=False, one_shot=True)
            except docker.errors.NotFound:
                return None
            return sample_from_engine_stats(stats)

        return await self._run(call)

    async def claim(self, container_id: str, channel_dir: Path) -> None:
        """Nothing to tell the engine: the channel's bind mount follows the folder the host renamed."""

    async def image_id(self, image: str) -> str | None:
        """The engine's id of `image` (it changes when the image is rebuilt under the same tag); None if absent."""

        def call(client: docker.DockerClient) -> str | None:
            try:
                return str(client.api.inspect_image(image)["Id"])
            except docker.errors.ImageNotFound:
                return None

        return await self._run(call)

    async def image_exists(self, image: str) -> bool:
        def call(client: docker.DockerClient) -> bool:
            try:
                client.api.inspect_image(image)
            except docker.errors.ImageNotFound:
                return False
            return True

        return await self._run(call)

    async def image_labels(self, image: str) -> dict[str, str] | None:
        """The image's labels ({} if none), None when the engine does not have it (`crewbot doctor`)."""

        def call(client: docker.DockerClient) -> dict[str, str] | None:
            try:
                attrs = client.api.inspect_image(image)
            except docker.errors.ImageNotFound:
                return None
            return {str(key): str(value) for key, value in ((attrs.get("Config") or {}).get("Labels") or {}).items()}

        return await self._run(call)

    async def close(self) -> None:
        """Refuse new calls, drop queued ones and close the client; running `wait` slices end by themselves."""
        self._closed.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
