"""A scripted fake LLM provider: OpenAI Chat Completions and Anthropic Messages, on 127.0.0.1 and/or a
Unix socket.

    async with FakeLLM(socket_path=tmp_path / "llm.sock") as llm:
        llm.openai.enqueue(openai_text("hello"))
        client = AsyncOpenAI(base_url=llm.base_url, api_key="k")
        ...
        assert llm.requests()[0].headers["authorization"] == "Bearer k"

It records every request (body and headers, and whether it came over TCP or the socket), and counts
clients that hang up before the answer (`disconnects`), which is how a test proves that cancelling a
call really closed its HTTP request.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aiohttp import web

from tests.fakes.faults import Fault, FaultQueue
from tests.fakes.llm_replies import (
    STREAM_PIECE_CHARS,
    JsonDict,
    anthropic_text,
    anthropic_tool_use,
    openai_stream_chunks,
    openai_text,
    openai_tool_call,
)
from tests.fakes.loopback_server import LoopbackServer
from tests.fakes.waiting import Watch

__all__ = [
    "FakeLLM",
    "Fault",
    "Handler",
    "RecordedRequest",
    "Script",
    "StreamPace",
    "anthropic_text",
    "anthropic_tool_use",
    "openai_text",
    "openai_tool_call",
]

T = TypeVar("T")
Api = Literal["openai", "anthropic"]
Handler = Callable[[JsonDict], JsonDict | Awaitable[JsonDict]]

DEFAULT_MODELS = ("fake-model",)
DEFAULT_WAIT_SECONDS = 5.0
_FAULT_KEY = "completion"

_OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error"}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON, or None
    raw_body: bytes
    via: Literal["tcp", "unix"]
    at: float  # time.monotonic()


class NoScriptError(Exception):
    """The test gave no answer for this request."""


class Script:
    """Answers for one API: queued bodies first, in order, then the handler (if any)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[JsonDict] = deque()
        self._handler: Handler | None = None

    def enqueue(self, *bodies: JsonDict) -> None:
        with self._lock:
            self._queue.extend(bodies)

    def handle_with(self, handler: Handler | None) -> None:
        """Answer with handler(request_json) (sync or async; runs on the server's loop) once the queue is empty."""
        with self._lock:
            self._handler = handler

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._queue)

    async def answer(self, request_body: JsonDict) -> JsonDict:
        with self._lock:
            queued = self._queue.popleft() if self._queue else None
            handler = self._handler
        if queued is not None:
            return copy.deepcopy(queued)  # the same body may be enqueued twice
        if handler is None:
            raise NoScriptError("no scripted response left and no handler set")
        result = handler(request_body)
        return copy.deepcopy(await result if inspect.isawaitable(result) else result)


class FakeLLM(LoopbackServer):
    """POST /v1/chat/completions (OpenAI), POST /v1/messages (Anthropic), GET /v1/models."""

    def __init__(
        self,
        *,
        socket_path: str | os.PathLike[str] | None = None,
        listen_tcp: bool = True,
        port: int = 0,
        api_key: str | None = None,
        models: Sequence[str] = DEFAULT_MODELS,
    ) -> None:
        """With `api_key` set, requests without it (Bearer for OpenAI, x-api-key for Anthropic) get 401."""
        super().__init__(port=port, socket_path=socket_path, listen_tcp=listen_tcp)
        self.openai = Script()
        self.anthropic = Script()
        self._api_key = api_key
        self._models = list(models)
        self._lock = threading.RLock()
        self._watch = Watch(self._lock)
        self._faults = FaultQueue()
        self._requests: list[RecordedRequest] = []
        self._disconnected: list[RecordedRequest] = []
        self._disconnected_at: list[float] = []  # time.monotonic() of each hang-up, as `_disconnected`
        self._delay_seconds = 0.0
        self._pace = StreamPace()

    @property
    def base_url(self) -> str:
        """For the OpenAI client (`.../v1`) over TCP; over the socket use `http://<any host>/v1`."""
        return f"{self.origin}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """For the Anthropic client, which appends `/v1/messages` itself."""
        return self.origin

    # --- test controls --------------------------------------------------------------------------

    def set_delay(self, seconds: float) -> None:
        """Wait this long before answering each completion (to cancel a call in flight)."""
        with self._lock:
            self._delay_seconds = seconds

    def set_stream_pace(self, pace: StreamPace) -> None:
        """How streamed answers arrive: pieces of `piece_chars`, `seconds_per_piece` apart, and how a stream
        ends (`cut_after` pieces: without a final chunk, or with an error event when `error_after_cut`)."""
        with self._lock:
            self._pace = pace

    def fail_next(self, fault: Fault, count: int = 1) -> None:
        """The next `count` completion requests (either API) get `fault`: 429/500/..., disconnect or hang."""
        if fault.kind == "truncate":
            raise ValueError("FakeLLM does not serve truncated answers")
        self._faults.add(_FAULT_KEY, fault, count)

    def requests(self, path: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self._requests if path is None or r.path == path]

    @property
    def disconnects(self) -> int:
        """Requests whose client hung up before the answer was complete."""
        with self._lock:
            return len(self._disconnected)

    def disconnected_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._disconnected)

    def disconnect_times(self) -> list[float]:
        """When (time.monotonic()) each client hung up, in the order of `disconnected_requests()`."""
        with self._lock:
            return list(self._disconnected_at)

    async def wait_for_requests(
        self, count: int = 1, timeout_seconds: float = DEFAULT_WAIT_SECONDS, *, path: str | None = None
    ) -> list[RecordedRequest]:
        try:
            return await self._watch.wait_for(lambda: _at_least(self.requests(path), count), timeout_seconds)
        except TimeoutError:
            got = len(self.requests(path))
            raise TimeoutError(f"expected {count} request(s) within {timeout_seconds} s; got {got}") from None

    async def wait_for_disconnects(
        self, count: int = 1, timeout_seconds: float = DEFAULT_WAIT_SECONDS
    ) -> list[RecordedRequest]:
        try:
            return await self._watch.wait_for(lambda: _at_least(self.disconnected_requests(), count), timeout_seconds)
        except TimeoutError:
            got = self.disconnects
            raise TimeoutError(f"expected {count} disconnect(s) within {timeout_seconds} s; got {got}") from None

    # --- HTTP -----------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models", self._list_models)
        return app

    def _on_closing(self) -> None:
        self._watch.notify()  # ends hung requests

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._completion(request, "openai")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._completion(request, "anthropic")

    async def _list_models(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        if "anthropic-version" in request.headers:
            data = [
                {"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in self._models
            ]
            return web.json_response(
                {"data": data, "has_more": False, "first_id": self._models[0], "last_id": self._models[-1]}
            )
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self._models],
            }
        )

    async def _record(self, request: web.Request) -> RecordedRequest:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        record = RecordedRequest(
            method=request.method,
            path=request.path,
            headers={name.lower(): value for name, value in request.headers.items()},
            body=body,
            raw_body=raw,
            via="tcp" if isinstance(sockname, tuple) else "unix",
            at=time.monotonic(),
        )
        with self._lock:
            self._requests.append(record)
            self._watch.notify()
        return record

    async def _completion(self, request: web.Request, api: Api) -> web.StreamResponse:
        record = await self._record(request)
        try:
            return await self._answer(request, record, api)
        except asyncio.CancelledError:
            if not self.closing:  # the client hung up, not our own shutdown
                with self._lock:
                    self._disconnected.append(record)
                    self._disconnected_at.append(time.monotonic())
                    self._watch.notify()
            raise

    async def _answer(self, request: web.Request, record: RecordedRequest, api: Api) -> web.StreamResponse:
        body = record.body
        if not isinstance(body, dict):
            return _error(api, 400, "We could not parse the JSON body of your request.")
        if self._api_key is not None and not _authorised(record.headers, api, self._api_key):
            return _error(api, 401, "invalid x-api-key" if api == "anthropic" else "Incorrect API key provided.")
        missing = _missing_fields(body, api)
        if missing:
            return _error(api, 400, f"{missing}: Field required")
        fault = self._faults.take(_FAULT_KEY)
        if fault is not None:
            return await self._serve_fault(request, fault, api)
        with self._lock:
            delay_seconds = self._delay_seconds
        if delay_seconds > 0:
            await asyncio.sleep(delay_seconds)
        script = self.openai if api == "openai" else self.anthropic
        try:
            answer = await script.answer(body)
        except NoScriptError as exc:
            return _error(api, 500, f"FakeLLM ({api}): {exc}")
        except Exception as exc:  # a broken test handler must show up, not hang the client
            log.exception("FakeLLM handler failed")
            return _error(api, 500, f"FakeLLM ({api}) handler raised {exc!r}")
        answer.setdefault("model", body.get("model"))
        if api == "openai" and body.get("stream"):
            with self._lock:
                pace = self._pace
            return await _stream_openai(request, answer, body, pace)
        if body.get("stream"):
            return _error(api, 400, "FakeLLM does not stream Anthropic Messages")
        return web.json_response(answer)

    async def _serve_fault(self, request: web.Request, fault: Fault, api: Api) -> web.StreamResponse:
        if fault.kind == "disconnect":
            if request.transport is not None:
                request.transport.close()
            return web.Response()
        if fault.kind == "hang":
            await self._watch.wait_for(lambda: True if self.closing else None, None)
            return _error(api, 503, "FakeLLM is shutting down")
        headers = {"retry-after": str(fault.retry_after_seconds)} if fault.retry_after_seconds else None
        return _error(api, fault.status, fault.description, headers=headers)


def _at_least(items: list[T], count: int) -> list[T] | None:
    return items if len(items) >= count else None


def _authorised(headers: dict[str, str], api: Api, key: str) -> bool:
    if api == "anthropic" and headers.get("x-api-key") == key:
        return True
    return headers.get("authorization") == f"Bearer {key}"


def _missing_fields(body: JsonDict, api: Api) -> str | None:
    required = ("model", "messages") if api == "openai" else ("model", "messages", "max_tokens")
    return next((name for name in required if name not in body), None)


def _error(api: Api, status: int, message: str, *, headers: dict[str, str] | None = None) -> web.Response:
    body: JsonDict
    if api == "anthropic":
        body = {"type": "error", "error": {"type": _ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message}}
    else:
        kind = _OPENAI_ERROR_TYPES.get(status, "requests" if status == 429 else "server_error")
        code = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status)
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


@dataclass(frozen=True)
class StreamPace:
    """How the fake streams (FakeLLM.set_stream_pace); the default: all at once, 8 characters a piece."""

    piece_chars: int = STREAM_PIECE_CHARS
    seconds_per_piece: float = 0.0
    cut_after: int | None = None  # pieces of text sent before the stream ends early
    error_after_cut: bool = False  # end with an error event (a provider failing mid-stream), else just EOF


async def _stream_openai(
    request: web.Request, completion: JsonDict, body: JsonDict, pace: StreamPace
) -> web.StreamResponse:
    """Server-sent events, one chunk per event, then `data: [DONE]`; paced and cut as `pace` says."""
    options = body.get("stream_options") or {}
    response = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
    await response.prepare(request)
    chunks = openai_stream_chunks(
        completion, include_usage=bool(options.get("include_usage")), piece_chars=pace.piece_chars
    )
    started = asyncio.get_running_loop().time()
    for number, chunk in enumerate(chunks):
        if pace.cut_after is not None and number > pace.cut_after:
            if pace.error_after_cut:
                error = {"error": {"message": "FakeLLM: upstream failed mid-stream", "type": "server_error"}}
                await response.write(f"data: {json.dumps(error)}\n\n".encode())
            await response.write_eof()
            return response
        if pace.seconds_per_piece > 0 and number > 0:
            # Piece n at n intervals from the start: a sleep's overshoot does not add up over a long answer.
            due = started + number * pace.seconds_per_piece
            await asyncio.sleep(max(due - asyncio.get_running_loop().time(), 0.0))
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
