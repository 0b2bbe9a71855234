"""The container's end of its run channel: task in; progress messages, session and result out.

One small HTTP client on the run's Unix socket (the host's LLM proxy serves the same socket). The host
answers every request with a `ChannelAnswer`; a refusal (over budget, run cancelled) comes back as
`ChannelRefused` with the host's reason, which the agent's tools show to the model. A channel that does not
answer at all (after the connect retries) raises `ConnectionError`, an `OSError` like any other I/O failure.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

import httpx2

from container.protocol import (
    MESSAGE_PATH,
    RESULT_PATH,
    SESSION_PATH,
    TASK_PATH,
    ChannelAnswer,
    ProgressMessage,
    RunResult,
    TaskSpec,
)

CHANNEL_ORIGIN = "http://run"  # any host: the transport goes to the socket
CHANNEL_TIMEOUT_SECONDS = 30.0
# Connecting is retried about 30 s in all: the socket refuses while the host restarts.
CHANNEL_CONNECT_RETRIES = 7
# The host closes connections to a run's socket beyond 16 at once (runner/capped_site.py). The channel and
# the LLM client keep 4 each, so requests sent all at once (parallel tool calls) wait their turn instead.
CHANNEL_MAX_CONNECTIONS = 4


class ChannelRefused(Exception):
    """The host refused the request; the message is its reason."""


class RunChannel:
    def __init__(self, socket_path: Path) -> None:
        transport = httpx2.AsyncHTTPTransport(
            uds=str(socket_path),
            retries=CHANNEL_CONNECT_RETRIES,
            limits=httpx2.Limits(max_connections=CHANNEL_MAX_CONNECTIONS),
        )
        self._client = httpx2.AsyncClient(transport=transport, base_url=CHANNEL_ORIGIN, timeout=CHANNEL_TIMEOUT_SECONDS)

    async def __aenter__(self) -> RunChannel:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._client.aclose()

    async def task(self) -> TaskSpec:
        response = await self._request("GET", TASK_PATH)
        if response.status_code != 200:
            raise ChannelRefused(_reason(response))
        return TaskSpec.model_validate_json(response.content)

    async def send_message(self, message: ProgressMessage) -> str:
        return await self._post(MESSAGE_PATH, message.model_dump_json().encode())

    async def save_session(self, history_json: bytes) -> str:
        return await self._post(SESSION_PATH, history_json)

    async def report(self, result: RunResult) -> str:
        return await self._post(RESULT_PATH, result.model_dump_json().encode())

    async def _post(self, path: str, body: bytes) -> str:
        response = await self._request("POST", path, body)
        if response.status_code != 200:
            raise ChannelRefused(_reason(response))
        return ChannelAnswer.model_validate_json(response.content).detail

    async def _request(self, method: str, path: str, body: bytes | None = None) -> httpx2.Response:
        # httpx2's transport errors are not OSErrors: without this, callers that handle a failed send (the
        # send_message tool, the session upload) would see an unexpected exception and fail the whole run.
        headers = {"Content-Type": "application/json"} if body is not None else None
        try:
            return await self._client.request(method, path, content=body, headers=headers)
        except httpx2.TransportError as exc:
            raise ConnectionError(
                f"the run channel did not answer {method} {path}: {type(exc).__name__}: {exc}"
            ) from exc


def _reason(response: httpx2.Response) -> str:
    try:
        return ChannelAnswer.model_validate_json(response.content).detail or f"HTTP {response.status_code}"
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:200]}"
