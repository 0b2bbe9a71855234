"""A subagent's first LLM call, sent by the host the moment its container has started.

A container spends about a second starting Python and importing the agent's libraries before it makes its
first call; the host has them loaded already. So the host runs the container's own code (container.run)
on the run's task up to the point where it would send its first request, keeps that request, and sends it
on the run's socket itself, marked as the host's (runner/llm_prefetch.py). The model then works while the
container starts, and the container's identical first request is answered with what that call got.

The request is learned in a worker thread with its own event loop: building the agent and its tool
schemas is CPU work that must not stall the bot. The threads are their own (the first learn imports the
provider's SDK, seconds under load), so the host's other thread work never waits behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx2

from container.channel import RunChannel
from container.protocol import WORKSPACE_DIR, TaskSpec
from core.logging import get_logger
from runner.llm_prefetch import PREFETCH_HEADER, PrefetchMark

log = get_logger(__name__)

# Learning the request takes milliseconds; a run that makes no call within this never will.
CAPTURE_TIMEOUT_SECONDS = 20.0
LEARN_THREADS = 2
URL_PART_SUFFIX = "-url"  # pydantic-ai's kinds of files given by URL: image-url, document-url, audio-url, ...
# JSON values in a prior session the host builds a first request from: 200 ordinary messages have about
# 6,000; building one costs about 0.25 ms a value, all of it before the capture's time limit can act.
MAX_HISTORY_NODES = 20_000
# The host's own copy of the first call waits for the provider as long as the container would.
SEND_TIMEOUT_SECONDS = 900.0
# Headers the container's client would send that belong to its own connection, not to the request.
_CONNECTION_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding"})
_UNUSED_SOCKET = Path("/nonexistent/crewbot-first-call.sock")


@dataclass(frozen=True, slots=True)
class FirstRequest:
    """The request the run's container will make first: its path, headers and body."""

    path: str
    headers: dict[str, str]
    body: bytes


class FirstRequestUnknown(Exception):
    """The container's code made no request (it would fail first, or took too long); the message says why."""


class _CapturingTransport(httpx2.AsyncBaseTransport):
    """Keeps the first request and never answers it: the run is stopped once the request is known."""

    def __init__(self, captured: asyncio.Future[FirstRequest]) -> None:
        self._captured = captured

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        if not self._captured.done():
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _CONNECTION_HEADERS}
            self._captured.set_result(FirstRequest(request.url.path, headers, body))
        never: asyncio.Future[httpx2.Response] = asyncio.get_running_loop().create_future()
        return await never  # the run is cancelled once its request is known


async def _learn(spec: TaskSpec, workspace_dir: Path) -> FirstRequest:
    from container.run import run_task  # pydantic-ai: imported by the first run, not at the host's start

    captured: asyncio.Future[FirstRequest] = asyncio.get_running_loop().create_future()
    transport = _CapturingTransport(captured)
    async with RunChannel(_UNUSED_SOCKET) as channel:  # the tools are not called before the first request
        run = asyncio.create_task(run_task(spec, channel, _UNUSED_SOCKET, workspace_dir, _quiet, transport=transport))
        try:
            waited: set[asyncio.Future[Any]] = {run, captured}
            await asyncio.wait(waited, timeout=CAPTURE_TIMEOUT_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        finally:
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
    if captured.done():
        return captured.result()
    ended = run.result().error if run.done() and not run.cancelled() else None
    raise FirstRequestUnknown(ended or f"no request within {CAPTURE_TIMEOUT_SECONDS:g} s")


def learn_first_request(spec: TaskSpec, workspace_dir: Path = Path(WORKSPACE_DIR)) -> FirstRequest:
    """The first request `spec`'s container (its workspace at `workspace_dir`, as the prompt says) will send.
    Raises FirstRequestUnknown when its code makes none, or when building it would fetch a URL. Blocking: run
    it in a worker thread."""
    reason = _unsuitable(spec.history)
    if reason is not None:
        raise FirstRequestUnknown(reason)
    return asyncio.run(_learn(spec, workspace_dir))


def _unsuitable(history: list[Any]) -> str | None:
    """Why the host must not build a request from this prior session (a container wrote it), or None."""
    pending: list[Any] = list(history)
    nodes = 0
    while pending:
        item = pending.pop()
        nodes += 1
        if nodes > MAX_HISTORY_NODES:
            # Building a request costs CPU and memory per item, in one go (no time limit can stop it): the
            # container, within its own limits, builds one that large itself.
            return f"the prior session has over {MAX_HISTORY_NODES} items"
        if isinstance(item, dict):
            kind = item.get("kind")
            if isinstance(kind, str) and kind.endswith(URL_PART_SUFFIX):
                # pydantic-ai downloads such files while it builds the request: on the host that would fetch
                # whatever the URL names, the host's own network included.
                return "the prior session refers to files by URL; only the container may fetch them"
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


def _quiet(line: str) -> None:
    """The container's progress log: the host's copy of its run has nothing to say."""


class FirstCalls:
    """Sends each started run's first call (when enabled); `close` ends the calls still waiting."""

    def __init__(self, mark: PrefetchMark, enabled: Callable[[], bool]) -> None:
        self._mark = mark
        self._enabled = enabled
        self._tasks: set[asyncio.Task[None]] = set()
        self._executor = ThreadPoolExecutor(max_workers=LEARN_THREADS, thread_name_prefix="first-call")

    def learn_soon(self, spec: TaskSpec) -> asyncio.Task[FirstRequest | None] | None:
        """Start learning the run's first request (None when the setting is off, or the containers' first
        requests stopped matching the host's copies)."""
        if not self._enabled() or not self._mark.allows_early_call():
            return None
        return asyncio.create_task(self._learn(spec), name=f"learn-first-call-{spec.run_id}")

    async def _learn(self, spec: TaskSpec) -> FirstRequest | None:
        started = time.monotonic()
        try:
            loop = asyncio.get_running_loop()
            learned = await loop.run_in_executor(self._executor, learn_first_request, spec)
            log.info("first_call_learned", run_id=spec.run_id, duration_ms=round((time.monotonic() - started) * 1000))
            return learned
        except Exception as exc:  # the container will make its call itself: nothing is lost
            log.warning("first_call_not_learned", run_id=spec.run_id, error=f"{type(exc).__name__}: {exc}")
            return None

    def send(self, run_id: str, socket_path: Path, learned: asyncio.Task[FirstRequest | None]) -> None:
        """Send the call on the run's socket once it is learned; its answer waits there for the container."""
        task = asyncio.create_task(self._send(run_id, socket_path, learned), name=f"first-call-{run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, run_id: str, socket_path: Path, learned: asyncio.Task[FirstRequest | None]) -> None:
        request = await learned
        if request is None:
            return
        headers = {**request.headers, PREFETCH_HEADER: self._mark.token}
        timeout = aiohttp.ClientTimeout(total=SEND_TIMEOUT_SECONDS)
        try:
            async with (
                aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket_path)), timeout=timeout) as http,
                http.post(f"http://run{request.path}", data=request.body, headers=headers) as response,
            ):
                await response.read()
                log.info("first_call_sent", run_id=run_id, status=response.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The run ended first, or the socket is gone: the container asks for itself if it still runs.
            log.info("first_call_not_sent", run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        except Exception:
            log.exception("first_call_failed", run_id=run_id)  # nobody awaits this task

    async def close(self) -> None:
        """Shutdown: the calls still waiting end (the containers make their own after the restart)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)  # a learn under way ends within its timeout
