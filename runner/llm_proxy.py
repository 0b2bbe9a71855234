"""The LLM proxy: each run gets its own Unix socket, and the host, not the container, talks to the provider.

A run is identified by the socket its request arrived on (no token to steal or forge). The proxy adds the
provider key, counts tokens and requests per run, and refuses (403) a run the manager no longer considers
live, checking before it forwards, while the upstream call is in flight, and when the answer comes back.

Streaming is passed through: for `stream: true` the upstream's server-sent events are relayed as they
arrive and the usage is read from the events as they pass (OpenAI chat completions get
`stream_options.include_usage` so the last event carries it). Once a stream has started a closed run can
no longer get a 403, so the proxy ends the stream with an error event instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from bot.logging import get_logger
from bot.settings import LLMProvider, Settings
from runner.offline_subagent import OfflineRequestError, OfflineSubagentModel, stream_chunks

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"  # OpenAI convention: the base includes /v1
DEFAULT_ANTHROPIC_BASE_URL = "https://api.anthropic.com"  # Anthropic convention: it does not
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_REQUESTS_PER_RUN = 500
GATE_POLL_SECONDS = 0.25
# Handlers get this long to finish their answer (usually a 403) when a run's socket closes.
CLOSE_GRACE_SECONDS = 2.0
SOCKET_MODE = 0o666  # the container's uid must connect; the run dir's permissions guard who can reach it
MAX_UNIX_PATH_BYTES = 107  # sun_path holds 108 bytes including the terminating NUL
# Only these request headers reach the provider: never the container's Authorization, x-api-key, cookies.
FORWARDED_HEADERS = ("accept", "anthropic-version", "anthropic-beta", "openai-beta")
SSE_CONTENT_TYPE = "text/event-stream"

# Container-side path -> path under the provider's base URL, per provider.
_ROUTES: Mapping[LLMProvider, Mapping[str, str]] = {
    LLMProvider.OPENAI: {"/v1/chat/completions": "/chat/completions", "/v1/responses": "/responses"},
    LLMProvider.ANTHROPIC: {"/v1/messages": "/v1/messages"},
    LLMProvider.OFFLINE: {"/v1/chat/completions": ""},
}


class RunGate(Protocol):
    def is_live(self, run_id: str) -> bool:
        """True while the run may call the LLM (queued or running, not cancelled). Must not block."""
        ...


class UsageSink(Protocol):
    async def record_usage(self, run_id: str, input_tokens: int, output_tokens: int, requests: int) -> None:
        """Add one call's usage to the run's totals (the values are increments, not totals)."""
        ...


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """Where the proxy sends calls. `base_url` is empty for the offline model."""

    provider: LLMProvider
    base_url: str = ""
    api_key: SecretStr | None = None
    timeout_seconds: float = 120.0

    @classmethod
    def from_settings(cls, settings: Settings) -> UpstreamConfig:
        defaults = {
            LLMProvider.OPENAI: DEFAULT_OPENAI_BASE_URL,
            LLMProvider.ANTHROPIC: DEFAULT_ANTHROPIC_BASE_URL,
            LLMProvider.OFFLINE: "",
        }
        base_url = settings.llm_base_url or defaults[settings.llm_provider]
        return cls(
            provider=settings.llm_provider,
            base_url=base_url.rstrip("/"),
            api_key=settings.llm_api_key,
            timeout_seconds=settings.llm_timeout_seconds,
        )


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def observe(self, event: Any) -> None:
        """Take the token counts from a response or a stream event, in any of the providers' shapes."""
        if not isinstance(event, Mapping):
            return
        for holder in (event, event.get("message"), event.get("response")):
            usage = holder.get("usage") if isinstance(holder, Mapping) else None
            if isinstance(usage, Mapping):
                self._take(usage)

    def _take(self, usage: Mapping[str, Any]) -> None:
        # Later events carry running totals (Anthropic's message_delta, OpenAI's final chunk): last wins.
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
        if isinstance(prompt, int):
            cached = sum(
                value
                for key in ("cache_creation_input_tokens", "cache_read_input_tokens")
                if isinstance(value := usage.get(key), int)
            )
            self.input_tokens = prompt + cached
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        if isinstance(completion, int):
            self.output_tokens = completion


class SseUsageScanner:
    """Reads `data:` lines of a server-sent event stream as they pass and keeps the latest usage seen."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_BODY_BYTES:
            self._pending = b""  # a runaway line is not an event we can use
        for line in lines:
            self._line(line)

    def close(self) -> None:
        self._line(self._pending)
        self._pending = b""

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[len(b"data:") :].strip()
        if not data.startswith(b"{"):
            return  # "[DONE]" and keep-alives
        with contextlib.suppress(ValueError):
            self.usage.observe(json.loads(data))


class ProxyError(Exception):
    """An answer the proxy gives itself: status, error type and a message the container's client shows."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message

    def response(self) -> web.Response:
        return error_response(self.status, self.error_type, self.message)


class _RunClosed(Exception):
    pass


def error_response(status: int, error_type: str, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": error_type}}, status=status)


def _closed_error(run_id: str) -> ProxyError:
    return ProxyError(403, "run_closed", f"run {run_id} is cancelled or finished")


@dataclass(eq=False, slots=True)
class _Run:
    run_id: str
    socket_path: Path
    runner: web.AppRunner | None = None
    requests: int = 0
    closed: bool = False
    calls: set[asyncio.Task[Any]] = field(default_factory=set)


@dataclass(slots=True)
class _Call:
    """One call's answer as it forms: a relayed stream's response is sent before the call ends."""

    usage: Usage = field(default_factory=Usage)
    stream: web.StreamResponse | None = None  # set once a relayed stream's headers are out


_RUN_KEY = web.AppKey("crewbot_run", _Run)


class LlmProxy:
    """Serves the LLM to each run on its own Unix socket; see the module docstring for the rules."""

    def __init__(
        self,
        upstream: UpstreamConfig,
        run_gate: RunGate,
        usage_sink: UsageSink,
        *,
        max_requests_per_run: int = DEFAULT_MAX_REQUESTS_PER_RUN,
        max_body_bytes: int = MAX_BODY_BYTES,
        gate_poll_seconds: float = GATE_POLL_SECONDS,
        offline_model: OfflineSubagentModel | None = None,
    ) -> None:
        self._upstream = upstream
        self._gate = run_gate
        self._sink = usage_sink
        self._max_requests = max_requests_per_run
        self._max_body_bytes = max_body_bytes
        self._gate_poll_seconds = gate_poll_seconds
        self._offline = offline_model or OfflineSubagentModel()
        self._routes = _ROUTES[upstream.provider]
        self._runs: dict[str, _Run] = {}
        self._session: aiohttp.ClientSession | None = None
        self._log = get_logger(__name__)

    # -- lifecycle --------------------------------------------------------------------------------

    async def open_run(self, run_id: str, socket_path: Path) -> None:
        """Listen on `socket_path` for this run (a stale socket file there is replaced)."""
        if run_id in self._runs:
            raise ValueError(f"run {run_id} already has an LLM socket")
        if len(os.fsencode(socket_path)) > MAX_UNIX_PATH_BYTES:
            raise ValueError(
                f"LLM socket path is {len(os.fsencode(socket_path))} bytes, over the {MAX_UNIX_PATH_BYTES}-byte "
                f"limit of Unix sockets: {socket_path} (use a shorter DATA_DIR)"
            )
        run = _Run(run_id=run_id, socket_path=socket_path)
        app = web.Application(client_max_size=self._max_body_bytes)
        app[_RUN_KEY] = run
        app.router.add_route("*", "/{path:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=CLOSE_GRACE_SECONDS)
        await runner.setup()
        try:
            await web.UnixSite(runner, str(socket_path)).start()
            os.chmod(socket_path, SOCKET_MODE)
        except BaseException:
            await runner.cleanup()
            raise
        run.runner = runner
        self._runs[run_id] = run
        self._log.info("llm_socket_open", run_id=run_id, socket=str(socket_path))

    async def close_run(self, run_id: str) -> None:
        """Stop serving the run: in-flight upstream calls are dropped and answered 403. Unknown run: no-op."""
        run = self._runs.pop(run_id, None)
        if run is None:
            return
        run.closed = True
        for task in list(run.calls):
            task.cancel()
        if run.runner is not None:
            await run.runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            run.socket_path.unlink()
        self._log.info("llm_socket_closed", run_id=run_id, requests=run.requests)

    async def close(self) -> None:
        for run_id in list(self._runs):
            await self.close_run(run_id)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def open_runs(self) -> list[str]:
        return list(self._runs)

    # -- one request ------------------------------------------------------------------------------

    def _live(self, run: _Run) -> bool:
        return not run.closed and self._gate.is_live(run.run_id)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        run = request.app[_RUN_KEY]
        started = time.monotonic()
        if not self._live(run):
            return self._refuse(run, request, started)
        try:
            target = self._route(request)
            payload = await self._read_payload(request)
            if run.requests >= self._max_requests:
                raise ProxyError(
                    429,
                    "run_request_limit",
                    f"run {run.run_id} reached its limit of {self._max_requests} LLM requests",
                )
        except ProxyError as exc:
            self._log_call(run, request, exc.status, None, started, error=exc.error_type)
            return exc.response()
        if not self._live(run):
            return self._refuse(run, request, started)

        run.requests += 1
        call = _Call()
        try:
            response = await self._guarded(run, self._answer(request, target, payload, call))
        except (_RunClosed, ProxyError) as exc:
            error = exc if isinstance(exc, ProxyError) else _closed_error(run.run_id)
            await self._record(run, call.usage)
            if call.stream is not None:
                return await self._end_stream(run, request, call.stream, error, call.usage, started)
            self._log_call(run, request, error.status, None, started, error=error.error_type)
            return error.response()

        await self._record(run, call.usage)
        if call.stream is None and not self._live(run):
            # The answer came back after the run was closed: the tokens are spent (recorded) but not delivered.
            return self._refuse(run, request, started)
        self._log_call(run, request, response.status, call.usage, started, stream=call.stream is not None)
        return response

    def _route(self, request: web.Request) -> str:
        if request.path not in self._routes:
            known = ", ".join(sorted(self._routes))
            raise ProxyError(404, "not_found", f"{request.path} is not served here ({known})")
        if request.method != "POST":
            raise ProxyError(405, "method_not_allowed", f"{request.path} takes POST")
        return self._upstream.base_url + self._routes[request.path]

    async def _read_payload(self, request: web.Request) -> dict[str, Any]:
        too_large = ProxyError(413, "request_too_large", f"request body is over {self._max_body_bytes} bytes")
        if request.content_length is not None and request.content_length > self._max_body_bytes:
            raise too_large
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_large from None
        try:
            payload = json.loads(body)
        except ValueError:
            raise ProxyError(400, "invalid_request", "request body is not JSON") from None
        if not isinstance(payload, dict):
            raise ProxyError(400, "invalid_request", "request body must be a JSON object")
        return payload

    async def _guarded(self, run: _Run, work: Awaitable[web.StreamResponse]) -> web.StreamResponse:
        """Run the call as a task the run owns; cancel it as soon as the run stops being live."""
        task: asyncio.Task[web.StreamResponse] = asyncio.ensure_future(work)
        run.calls.add(task)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=self._gate_poll_seconds)
                if not task.done() and not self._live(run):
                    task.cancel()
                    await asyncio.wait({task})  # let it unwind: that closes the upstream connection
            if task.cancelled():
                raise _RunClosed
            return task.result()
        finally:
            run.calls.discard(task)
            if not task.done():
                task.cancel()  # our own handler was cancelled (the container hung up)

    async def _answer(
        self, request: web.Request, target: str, payload: dict[str, Any], call: _Call
    ) -> web.StreamResponse:
        if self._upstream.provider is LLMProvider.OFFLINE:
            return self._answer_offline(payload, call)
        return await self._forward(request, target, payload, call)

    def _answer_offline(self, payload: dict[str, Any], call: _Call) -> web.StreamResponse:
        try:
            completion = self._offline.complete(payload)
        except OfflineRequestError as exc:
            raise ProxyError(400, "invalid_request", str(exc)) from None
        call.usage.observe(completion)
        if not payload.get("stream"):
            return web.json_response(completion)
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        events = [f"data: {json.dumps(chunk)}\n\n" for chunk in stream_chunks(completion, include_usage)]
        return web.Response(text="".join(events) + "data: [DONE]\n\n", content_type=SSE_CONTENT_TYPE)

    def _upstream_headers(self, request: web.Request) -> dict[str, str]:
        headers = {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}
        headers["Content-Type"] = "application/json"
        key = self._upstream.api_key.get_secret_value() if self._upstream.api_key is not None else None
        if self._upstream.provider is LLMProvider.ANTHROPIC:
            headers.setdefault("anthropic-version", DEFAULT_ANTHROPIC_VERSION)
            if key:
                headers["x-api-key"] = key
        elif key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No environment proxies or .netrc: the provider is reached exactly as configured.
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    async def _forward(
        self, request: web.Request, target: str, payload: dict[str, Any], call: _Call
    ) -> web.StreamResponse:
        stream = bool(payload.get("stream"))
        if stream and request.path == "/v1/chat/completions":
            # Without it an OpenAI stream carries no usage and the run's tokens would go uncounted.
            payload["stream_options"] = {**(payload.get("stream_options") or {}), "include_usage": True}
        limit = self._upstream.timeout_seconds
        # A stream may legitimately run longer than the timeout; it is bounded by silence instead.
        timeout = aiohttp.ClientTimeout(total=None if stream else limit, sock_connect=limit, sock_read=limit)
        try:
            async with self._client().post(
                target, data=json.dumps(payload).encode(), headers=self._upstream_headers(request), timeout=timeout
            ) as upstream:
                content_type = upstream.headers.get("Content-Type", "application/json")
                if stream and upstream.status == 200 and content_type.startswith(SSE_CONTENT_TYPE):
                    return await self._relay(request, upstream, content_type, call)
                body = await _read_limited(upstream.content, MAX_RESPONSE_BYTES)
        except TimeoutError:
            raise ProxyError(504, "upstream_timeout", f"the LLM provider did not answer within {limit:g} s") from None
        except aiohttp.ClientError as exc:
            raise ProxyError(502, "upstream_error", f"the LLM provider could not be reached: {exc}") from None
        if upstream.status == 200:
            with contextlib.suppress(ValueError):
                call.usage.observe(json.loads(body))
        # Provider errors (400, 401, 429, 5xx) pass through as they are: the client's retry logic needs them.
        return web.Response(status=upstream.status, body=body, headers={"Content-Type": content_type})

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        content_type: str,
        call: _Call,
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
        call.stream = response
        await response.prepare(request)
        scanner = SseUsageScanner(call.usage)
        async for chunk in upstream.content.iter_any():
            scanner.feed(chunk)
            await response.write(chunk)
        scanner.close()
        await response.write_eof()
        return response

    # -- answers and bookkeeping ------------------------------------------------------------------

    def _refuse(self, run: _Run, request: web.Request, started: float) -> web.Response:
        error = _closed_error(run.run_id)
        self._log_call(run, request, error.status, None, started, error=error.error_type)
        return error.response()

    async def _end_stream(
        self,
        run: _Run,
        request: web.Request,
        stream: web.StreamResponse,
        error: ProxyError,
        usage: Usage,
        started: float,
    ) -> web.StreamResponse:
        """A stream already under way cannot become a 403 or 502: end it with an error event the SDKs raise on."""
        body = {"type": error.error_type, "message": error.message}
        if self._upstream.provider is LLMProvider.ANTHROPIC:
            event = f"event: error\ndata: {json.dumps({'type': 'error', 'error': body})}\n\n"
        else:
            event = f"data: {json.dumps({'error': body})}\n\n"
        with contextlib.suppress(ConnectionError, RuntimeError):
            await stream.write(event.encode())
            await stream.write_eof()
        self._log_call(run, request, stream.status, usage, started, error=f"{error.error_type}_mid_stream", stream=True)
        return stream

    async def _record(self, run: _Run, usage: Usage) -> None:
        try:
            await self._sink.record_usage(run.run_id, usage.input_tokens, usage.output_tokens, 1)
        except Exception:
            # Bookkeeping must not turn a good answer into an error; the log keeps the numbers.
            self._log.exception(
                "llm_usage_not_recorded",
                run_id=run.run_id,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
            )

    def _log_call(
        self,
        run: _Run,
        request: web.Request,
        status: int,
        usage: Usage | None,
        started: float,
        *,
        error: str | None = None,
        stream: bool = False,
    ) -> None:
        fields: dict[str, Any] = {
            "run_id": run.run_id,
            "path": request.path,
            "status": status,
            "duration_ms": round((time.monotonic() - started) * 1000),
            "provider": self._upstream.provider.value,
        }
        if usage is not None:
            fields.update(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
        if stream:
            fields["stream"] = True
        if error is not None:
            fields["error"] = error
            self._log.warning("llm_call", **fields)
        else:
            self._log.info("llm_call", **fields)


async def _read_limited(content: aiohttp.StreamReader, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise ProxyError(502, "upstream_response_too_large", f"the LLM provider's answer is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
