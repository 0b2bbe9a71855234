"""The Docker engine as the benchmarks see it: its event stream, bare containers for baselines, clean-up.

Only containers labelled `crewbot=1` are looked at, and only those whose `crewbot.chat_id` is one of the
benchmark's own chats are ever removed: other people's tests may run containers at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import docker
import docker.errors
from docker.types import Mount as DockerMount

from runner.runtimes.runtime import LABEL_APP, LABEL_CHAT_ID

BARE_NAME_PREFIX = "crewbot-bench-"
ENGINE_TIMEOUT_SECONDS = 60


def engine_client() -> docker.DockerClient:
    return docker.from_env(timeout=ENGINE_TIMEOUT_SECONDS)


@dataclass(frozen=True, slots=True)
class EngineEvent:
    at: float  # time.perf_counter() when the event reached this process
    action: str  # the engine's word: create, start, die, destroy, kill, ...
    container_id: str
    name: str


class EngineEvents:
    """Container events of crewbot-labelled containers, stamped with this host's clock on arrival.

    The stream is read on a daemon thread (the SDK blocks); waiters are woken through the loop.
    """

    def __init__(self) -> None:
        self._events: list[EngineEvent] = []
        self._lock = threading.Lock()
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: docker.DockerClient | None = None
        self._stream: Any = None
        self._thread: threading.Thread | None = None

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        self._client = engine_client()
        client = self._client
        # The call returns once the engine has answered the request: from here no event is missed.
        self._stream = await asyncio.to_thread(
            lambda: client.api.events(decode=True, filters={"type": "container", "label": f"{LABEL_APP}=1"})
        )
        self._thread = threading.Thread(target=self._pump, name="engine-events", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(Exception):
            self._stream.close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        if self._client is not None:
            self._client.close()

    def _pump(self) -> None:
        try:
            for raw in self._stream:
                at = time.perf_counter()
                actor = raw.get("Actor") or {}
                event = EngineEvent(
                    at=at,
                    action=str(raw.get("Action") or raw.get("status") or ""),
                    container_id=str(actor.get("ID") or raw.get("id") or ""),
                    name=str((actor.get("Attributes") or {}).get("name", "")),
                )
                with self._lock:
                    self._events.append(event)
                if self._loop is not None and not self._loop.is_closed():
                    self._loop.call_soon_threadsafe(self._changed.set)
        except Exception:
            return  # the stream was closed under us: that is how it ends

    def _find(self, container_id: str, action: str) -> EngineEvent | None:
        with self._lock:
            for event in self._events:
                if event.action == action and event.container_id.startswith(container_id):
                    return event
        return None

    async def wait(self, container_id: str, action: str, timeout_seconds: float) -> float:
        """When `action` happened to the container (perf_counter), waiting for it if it has not yet."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            self._changed.clear()
            found = self._find(container_id, action)
            if found is not None:
                return found.at
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {action!r} event for container {container_id[:12]} in {timeout_seconds:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)


# --- bare containers (the baselines) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BareMount:
    source: str
    target: str


def image_interpreter(client: docker.DockerClient, image: str) -> str:
    """The program of the image's ENTRYPOINT (the subagent's Python), for a like-for-like override."""
    entrypoint = client.images.get(image).attrs["Config"].get("Entrypoint") or ["python3"]
    return str(entrypoint[0])


def bare_start(
    client: docker.DockerClient,
    image: str,
    *,
    name: str,
    entrypoint: list[str],
    command: list[str],
    chat_id: int,
    user: str,
    mounts: list[BareMount] | None = None,
) -> str:
    """`docker run -d --network none --entrypoint ...`: create and start, nothing else; returns the id."""
    container = client.containers.create(
        image,
        command,
        entrypoint=entrypoint,
        name=name,
        labels={LABEL_APP: "1", LABEL_CHAT_ID: str(chat_id), "crewbot.bench": "1"},
        network_mode="none",
        user=user,
        mounts=[DockerMount(target=m.target, source=m.source, type="bind") for m in mounts or []],
        detach=True,
    )
    container.start()
    return str(container.id)


def kill_container(client: docker.DockerClient, container_id: str) -> None:
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        client.api.kill(container_id)


def remove_container(client: docker.DockerClient, container_id: str) -> None:
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        client.api.remove_container(container_id, force=True)


def running_containers_of(client: docker.DockerClient, chat_ids: set[int]) -> int:
    """How many containers of these chats the engine reports running now (one list call)."""
    listed = client.api.containers(filters={"label": f"{LABEL_APP}=1", "status": "running"})
    return sum(1 for c in listed if _chat_label(c.get("Labels") or {}) in chat_ids)


def _chat_label(labels: dict[str, str]) -> int | None:
    try:
        return int(labels.get(LABEL_CHAT_ID, ""))
    except ValueError:
        return None


def remove_containers_of_chats(lowest: int, highest: int) -> int:
    """Force-remove crewbot containers whose chat id lies in [lowest, highest]; returns how many."""
    client = engine_client()
    removed = 0
    try:
        for listed in client.api.containers(all=True, filters={"label": f"{LABEL_APP}=1"}):
            chat_id = _chat_label(listed.get("Labels") or {})
            if chat_id is not None and lowest <= chat_id <= highest:
                remove_container(client, str(listed["Id"]))
                removed += 1
    finally:
        client.close()
    return removed


def docker_server_version() -> str:
    try:
        client = engine_client()
        try:
            return str(client.version().get("Version", "unknown"))
        finally:
            client.close()
    except Exception as exc:
        return f"unavailable ({type(exc).__name__})"
