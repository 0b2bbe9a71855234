"""The container's end of its run channel: task and files in; model steps, progress messages, files, session
and result out.

Plain `http.client` over the run's Unix socket, each request in a daemon thread of its own: the agent
starts without an HTTP library to import, and a request still blocked when the run stops does not hold
the process up. The host answers with a `ChannelAnswer` JSON; a refusal (over budget, run cancelled)
becomes `ChannelRefused` with the host's reason, which the agent's tools show to the model. A channel that
does not answer at all (after the connect retries) raises `ConnectionError`, an `OSError` like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from container.channel_files import (
    MAX_REASON_BYTES,
    BadBody,
    LocalFileFailed,
    Upload,
    fetch_limit,
    receive_or_refusal,
)
from container.channel_threads import in_daemon_thread
from container.contract import (
    ASK_PATH,
    FILES_PATH,
    MCP_CALL_WAIT_SECONDS,
    MCP_PATH,
    MESSAGE_PATH,
    MODEL_PATH,
    RESULT_PATH,
    SESSION_PATH,
    TASK_PATH,
    VERSION_PATTERN,
    WORKSPACE_BASE_HEADER,
    WORKSPACE_PATH,
    WORKSPACE_VERSION_HEADER,
)
from container.task import RunResult, Task

T = TypeVar("T")

CHANNEL_TIMEOUT_SECONDS = 30.0
# One read or write of a workspace transfer: the host syncs an upload of up to the quota to disk before it answers.
WORKSPACE_TIMEOUT_SECONDS = 300.0
# A model step waits for the provider (the host gives it 600 s, and one retry) and the host's budget queue.
STEP_TIMEOUT_SECONDS = 1_500.0
# Connecting is tried again after these pauses (about 30 s in all): the socket is missing or refuses while
# the host restarts, and the run must outlive a normal restart.
CONNECT_RETRY_DELAYS_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
# Bridged (Kubernetes), the socket appears once the host's exec of the bridge has started, a moment after the
# agent does: it is looked for every 50 ms at first, then as above.
BRIDGED_POLL_SECONDS = 0.05
BRIDGED_POLLS = 60  # 3 s of polling: the exec and the bridge's own start take a few hundred ms
BRIDGED_CONNECT_RETRY_DELAYS_SECONDS = (*(BRIDGED_POLL_SECONDS,) * BRIDGED_POLLS, *CONNECT_RETRY_DELAYS_SECONDS)
# The host closes connections to a run's socket beyond 16 at once (runner/channel/capped_site.py): requests sent
# all at once wait their turn here instead.
MAX_CONNECTIONS = 4
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # the task (its prior session) or a model response; the host's are smaller
# The container waits this long for a host that is away (a restart, an upgrade) to answer its task request,
# a model step or its result: a request in flight when the host died fails at once, and the socket refuses
# until it is back.
HOST_AWAY_SECONDS = 900.0
# A question waits for the chat as long as the host lets it (SUBAGENT_ASK_TIMEOUT_SECONDS, at most a day, and the
# run's own time limit): the host answers or closes first.
ASK_WAIT_SECONDS = 24 * 3600.0 + 60.0
HOST_FIRST_RETRY_SECONDS = 1.0
HOST_MAX_RETRY_SECONDS = 30.0


class ChannelRefused(Exception):
    """The host refused the request; the message is its reason, `status` its HTTP status when it answered one."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.status = status


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: Path, timeout: float | None) -> None:
        super().__init__("run", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self._socket_path))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _silent(line: str) -> None:
    """No log: a channel whose owner keeps none."""


class RunChannel:
    def __init__(
        self,
        socket_path: Path,
        log: Callable[[str], None] = _silent,
        connect_delays_seconds: tuple[float, ...] = CONNECT_RETRY_DELAYS_SECONDS,
    ) -> None:
        self._socket_path = socket_path
        self._log = log
        self._connect_delays = connect_delays_seconds
        self._connections = asyncio.Semaphore(MAX_CONNECTIONS)

    async def __aenter__(self) -> RunChannel:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def task(self, wait_seconds: float | None = CHANNEL_TIMEOUT_SECONDS) -> Task:
        """`wait_seconds` None: no time limit (a warm pool member waits for its run, blocked in a read)."""
        status, body = await self._request("GET", TASK_PATH, None, wait_seconds)
        if status != 200:
            raise ChannelRefused(_reason(status, body))
        return Task.from_json(body)

    async def model_step(self, step: dict[str, Any]) -> dict[str, Any]:
        """The model's response (a pydantic-ai ModelResponse as JSON) to the conversation in `step`."""
        body_out = json.dumps(step).encode()
        status, body = await while_host_away(
            lambda: self._request("POST", MODEL_PATH, body_out, STEP_TIMEOUT_SECONDS), "a model step", self._log
        )
        if status != 200:
            raise ChannelRefused(_reason(status, body))
        try:
            response = json.loads(body)["response"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ChannelRefused(f"the host's model step answer is not usable: {exc}") from None
        if not isinstance(response, dict):
            raise ChannelRefused("the host's model step answer is not usable: not an object")
        return response

    async def send_message(self, message_id: str, text: str) -> str:
        return await self._post(MESSAGE_PATH, json.dumps({"message_id": message_id, "text": text}).encode())

    async def ask(self, ask_id: str, question: str, options: list[str]) -> dict[str, Any]:
        """The chat's answer to a question (an AskAnswer as JSON), once it has one, nobody answered in time or
        the run is ending. Asked again with the same `ask_id` while the host is away (a restart): the host
        keeps the question, and its answer, for the retry."""
        body_out = json.dumps({"ask_id": ask_id, "question": question, "options": options}).encode()
        status, body = await while_host_away(
            lambda: self._request("POST", ASK_PATH, body_out, ASK_WAIT_SECONDS), "a question", self._log
        )
        if status != 200:
            raise ChannelRefused(_reason(status, body), status)
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise ChannelRefused(f"the host's answer to a question is not usable: {exc}") from None
        if not isinstance(answer, dict) or not isinstance(answer.get("outcome"), str):
            raise ChannelRefused("the host's answer to a question is not usable: no outcome")
        return answer

    async def mcp_call(self, tool: str, arguments: dict[str, Any]) -> str:
        """The result of an MCP tool the host calls for this run; ChannelRefused with the host's reason."""
        status, answer = await self._request(
            "POST", MCP_PATH, json.dumps({"tool": tool, "arguments": arguments}).encode(), MCP_CALL_WAIT_SECONDS
        )
        return _detail(status, answer)

    async def save_session(self, history_json: bytes) -> str:
        return await self._post(SESSION_PATH, history_json)

    async def report(self, result: RunResult) -> str:
        return await self._post(RESULT_PATH, result.to_json())

    async def fetch_file(self, index: int, fd: int, size_bytes: int) -> int:
        """Write the task's offered file `index` into the open file `fd` (from its start); returns its size.

        The host's refusal, or a body shorter than offered or longer than `size_bytes` and a little, raises
        ChannelRefused; a channel that stops answering ConnectionError (after trying again while the host is
        away); a write that fails in the container (a full disk) the OSError of that write."""
        path = f"{FILES_PATH}/{index}"
        limit = fetch_limit(size_bytes)

        def exchange(owned: int) -> tuple[int, bytes | int]:
            return self._blocking_exchange(
                "GET", path, None, {}, CHANNEL_TIMEOUT_SECONDS, lambda r: receive_or_refusal(r, owned, limit)
            )

        try:
            status, answer = await while_host_away(lambda: self._with_fd(fd, exchange), f"file {index}", self._log)
        except LocalFileFailed as exc:
            raise exc.error from None
        except BadBody as exc:
            raise ChannelRefused(str(exc)) from None
        if isinstance(answer, bytes):
            raise ChannelRefused(_reason(status, answer))
        if answer < size_bytes:
            raise ChannelRefused(f"the download ended after {answer} of the {size_bytes} bytes offered")
        return answer

    async def send_file(self, upload_id: str, name: str, caption: str | None, fd: int, size: int) -> str:
        """Send `size` bytes of the open file `fd` (read from its start, never by name) to the chat as `name`;
        returns the host's word ("sent", "already sent"). A refusal raises ChannelRefused with the host's reason,
        a read that fails in the container its OSError. A channel that breaks mid-upload is tried once more
        with the same `upload_id`, which the host sends only once."""
        upload = Upload.build({"upload_id": upload_id, "name": name, "caption": caption}, name, size)

        def exchange(owned: int) -> tuple[int, bytes]:
            return self._blocking_exchange(
                "POST", FILES_PATH, lambda: upload.body(owned), upload.headers(), CHANNEL_TIMEOUT_SECONDS, _read_answer
            )

        try:
            try:
                status, answer = await self._with_fd(fd, exchange)
            except ConnectionError as exc:
                self._log(f"a file upload broke off ({exc}); trying once more")
                await asyncio.sleep(HOST_FIRST_RETRY_SECONDS)
                status, answer = await self._with_fd(fd, exchange)
        except LocalFileFailed as exc:
            raise exc.error from None
        return _detail(status, answer)

    async def fetch_workspace(self, unpack: Callable[[http.client.HTTPResponse], T]) -> tuple[str | None, T | None]:
        """`GET /run/workspace`: the stored archive's version (None: the host named none), and what `unpack` (in the
        channel's thread) made of the body, None when the chat has no workspace yet. Tried again while the host is
        away, `unpack` from the start; a refusal raises ChannelRefused, and what `unpack` raises goes up."""

        def receive(response: http.client.HTTPResponse) -> tuple[str | None, T | None, bytes]:
            named = response.getheader(WORKSPACE_VERSION_HEADER, "")
            version = named if re.fullmatch(VERSION_PATTERN, named) else None
            if response.status == 200:
                return version, unpack(response), b""
            return version, None, response.read(MAX_REASON_BYTES)

        def exchange() -> tuple[int, tuple[str | None, T | None, bytes]]:
            return self._blocking_exchange("GET", WORKSPACE_PATH, None, {}, WORKSPACE_TIMEOUT_SECONDS, receive)

        status, (version, unpacked, refusal) = await while_host_away(
            lambda: self._alone(exchange), "workspace", self._log
        )
        if status == 204:
            return version, None
        if status != 200:
            raise ChannelRefused(_reason(status, refusal), status)
        return version, unpacked

    async def send_workspace(self, body: Callable[[], Iterable[bytes]], length: int, base: str | None = None) -> str:
        """`PUT /run/workspace`, the body of `length` bytes sent from a fresh `body()` per attempt (the host takes
        no chunked body); tried again while the host is away. `base`: the version it stands on, kept only if still
        the chat's (None: replace whatever is stored). Returns the host's word; a refusal (over the quota, or
        WORKSPACE_STALE_STATUS: stale) raises ChannelRefused with the host's reason and status."""
        headers = {"Content-Type": "application/x-tar", "Content-Length": str(length)}
        if base is not None:
            headers[WORKSPACE_BASE_HEADER] = base

        def exchange() -> tuple[int, bytes]:
            return self._blocking_exchange(
                "PUT", WORKSPACE_PATH, body, headers, WORKSPACE_TIMEOUT_SECONDS, _read_answer
            )

        status, answer = await while_host_away(lambda: self._alone(exchange), "the workspace", self._log)
        return _detail(status, answer)

    async def set_aside_workspace(self, served: str, reason: str) -> str:
        """`POST /run/workspace`: the archive a GET served as `served` could not be unpacked, for `reason`; the host
        sets it aside. Returns the host's word; a refusal (it was replaced since) raises ChannelRefused. Tried again
        while the host is away: the host answers a repeat as it did the first."""
        body = json.dumps({"served": served, "reason": reason}).encode()
        return await while_host_away(lambda: self._post(WORKSPACE_PATH, body), "the workspace", self._log)

    async def _alone(self, work: Callable[[], T]) -> T:
        async with self._connections:
            return await in_daemon_thread(work)

    async def _post(self, path: str, body: bytes) -> str:
        status, answer = await self._request("POST", path, body)
        return _detail(status, answer)

    async def _request(
        self, method: str, path: str, body: bytes | None = None, wait_seconds: float | None = CHANNEL_TIMEOUT_SECONDS
    ) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        payload = None if body is None else (lambda: body)
        async with self._connections:
            return await in_daemon_thread(
                lambda: self._blocking_exchange(method, path, payload, headers, wait_seconds, _read_answer)
            )

    async def _with_fd(self, fd: int, work: Callable[[int], T]) -> T:
        """`work` on a duplicate of `fd` in the channel's thread: the thread closes it when done, so a caller
        that stops waiting (a cancelled run) may close its own `fd` and no number is written after reuse."""
        async with self._connections:
            owned = os.dup(fd)

            def run() -> T:
                try:
                    return work(owned)
                finally:
                    os.close(owned)

            return await in_daemon_thread(run)

    def _blocking_exchange(
        self,
        method: str,
        path: str,
        body: Callable[[], bytes | Iterable[bytes]] | None,
        headers: dict[str, str],
        timeout: float | None,
        read: Callable[[http.client.HTTPResponse], T],
    ) -> tuple[int, T]:
        last_error: OSError | None = None
        for delay in (0.0, *self._connect_delays):
            time.sleep(delay)
            connection = _UnixConnection(self._socket_path, timeout)
            try:
                try:
                    connection.connect()
                except OSError as exc:  # missing or refusing while the host restarts
                    last_error = exc
                    continue
                try:
                    _send(connection, method, path, None if body is None else body(), headers)
                    response = connection.getresponse()
                    return response.status, read(response)
                except (OSError, http.client.HTTPException) as exc:
                    raise ConnectionError(
                        f"the run channel did not answer {method} {path}: {type(exc).__name__}: {exc}"
                    ) from exc
            finally:
                connection.close()
        raise ConnectionError(f"the run channel did not answer {method} {path}: {last_error}")


def _send(
    connection: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | Iterable[bytes] | None,
    headers: dict[str, str],
) -> None:
    """Send the request. A host that refuses a request early (an upload, a second result) may answer and close
    before reading all of it: the write then fails, and the answer waiting on the socket is still the one to read
    (a host that died has none: reading it fails, as the caller expects)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        connection.request(method, path, body=body, headers=headers)


def _read_answer(response: http.client.HTTPResponse) -> bytes:
    return response.read(MAX_ANSWER_BYTES)


async def while_host_away(call: Callable[[], Awaitable[T]], what: str, log: Callable[[str], None]) -> T:
    """`call()`, tried again with a growing pause while the channel does not answer (ConnectionError) for up
    to HOST_AWAY_SECONDS; then, or on any other error, the error is raised."""
    deadline = time.monotonic() + HOST_AWAY_SECONDS
    delay = HOST_FIRST_RETRY_SECONDS
    while True:
        try:
            return await call()
        except ConnectionError:
            if time.monotonic() + delay > deadline:
                raise
            log(f"{what}: the host is not answering; trying again in {delay:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, HOST_MAX_RETRY_SECONDS)


def _detail(status: int, answer: bytes) -> str:
    """An accepting answer's detail ("sent"); a refusal raises ChannelRefused with the host's reason."""
    if status != 200:
        raise ChannelRefused(_reason(status, answer), status)
    try:
        detail = json.loads(answer).get("detail", "")
    except (ValueError, AttributeError):
        return ""
    return detail if isinstance(detail, str) else ""


def _reason(status: int, body: bytes) -> str:
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        detail = None
    return detail if isinstance(detail, str) and detail else f"HTTP {status}: {body[:200].decode(errors='replace')}"
