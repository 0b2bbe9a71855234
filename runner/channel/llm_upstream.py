"""The provider side of the LLM proxy: where a call goes, with which headers and key, and how its answer comes back.

`Upstream` maps the container's paths to the provider's, adds the provider key (of the container's headers,
only those the request policy allows: runner/channel/llm_policy.py), applies the timeouts and size limits, and either
returns the provider's answer whole or relays a stream as it arrives, counting its tokens on the way. The
offline model answers here too. Run bookkeeping (liveness, limits, usage records) is the proxy's, in
runner/channel/llm_proxy.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from core.settings import LLMProvider, Settings
from runner.channel.llm_policy import RequestPolicy
from runner.channel.llm_usage import SseUsageScanner, Usage
from runner.channel.offline_subagent import OfflineRequestError, OfflineSubagentModel, stream_chunks
from runner.channel.proxy_error import ProxyError

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"  # OpenAI convention: the base includes /v1
DEFAULT_ANTHROPIC_BASE_URL = "https://api.anthropic.com"  # Anthropic convention: it does not
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
SSE_CONTENT_TYPE = "text/event-stream"

# Where the one served path (`RequestPolicy.path`) goes under each provider's base URL.
_UPSTREAM_PATHS: Mapping[LLMProvider, str] = {
    LLMProvider.OPENAI: "/chat/completions",
    LLMProvider.ANTHROPIC: "/v1/messages",
    LLMProvider.OFFLINE: "",
}


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
class Call:
    """One call's answer as it forms: a relayed stream's response is sent before the call ends."""

    usage: Usage = field(default_factory=Usage)
    stream: web.StreamResponse | None = None  # set once a relayed stream's headers are out
    status: int | None = None  # the provider's HTTP status, once it answered
    answer_bytes: int = 0  # what it answered (an answer without usage is counted from its size)

    @property
    def answered(self) -> bool:
        """The provider answered the call (it cost tokens), rather than failing or being cut off before."""
        return self.stream is not None or self.status == 200


class Upstream:
    """The provider (or the offline model) behind the proxy; one HTTP session serves every run.
    Which of the container's headers reach the provider is the policy's rule, as is what of the body does."""

    def __init__(
        self, config: UpstreamConfig, policy: RequestPolicy, offline_model: OfflineSubagentModel | None = None
    ) -> None:
        self.config = config
        self._policy = policy
        self._offline = offline_model or OfflineSubagentModel()
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def target(self, request: web.Request) -> str:
        """The provider URL for this request; 404 for a path not served, 405 for anything but POST."""
        self._policy.check_path(request.path)
        if request.method != "POST":
            raise ProxyError(405, "method_not_allowed", f"{request.path} takes POST")
        return self.config.base_url + _UPSTREAM_PATHS[self.config.provider]

    def outgoing(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The payload as the provider gets it: an OpenAI stream asks for its usage (without it a stream carries
        none, and the run's tokens would go uncounted)."""
        forwarded = self.config.provider is not LLMProvider.OFFLINE
        if forwarded and payload.get("stream") and path == "/v1/chat/completions":
            return {**payload, "stream_options": {**(payload.get("stream_options") or {}), "include_usage": True}}
        return payload

    async def answer(
        self, request: web.Request, target: str, payload: dict[str, Any], data: bytes, call: Call
    ) -> web.StreamResponse:
        """The answer to one call of `payload` (`outgoing`'s, serialized as `data`); tokens go to `call.usage`,
        and `call.stream` is set once a relay starts."""
        if self.config.provider is LLMProvider.OFFLINE:
            return self._answer_offline(payload, call)
        return await self._forward(request, target, bool(payload.get("stream")), data, call)

    def stream_error_event(self, error: ProxyError) -> str:
        """The event that ends a stream already under way with an error, in the shape the provider's SDK raises on."""
        body = {"type": error.error_type, "message": error.message}
        if self.config.provider is LLMProvider.ANTHROPIC:
            return f"event: error\ndata: {json.dumps({'type': 'error', 'error': body})}\n\n"
        return f"data: {json.dumps({'error': body})}\n\n"

    def _answer_offline(self, payload: dict[str, Any], call: Call) -> web.StreamResponse:
        try:
            completion = self._offline.complete(payload)
        except OfflineRequestError as exc:
            raise ProxyError(400, "invalid_request", str(exc)) from None
        call.usage.observe(completion)
        call.status = 200
        if not payload.get("stream"):
            return web.json_response(completion)
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        events = [f"data: {json.dumps(chunk)}\n\n" for chunk in stream_chunks(completion, include_usage)]
        return web.Response(text="".join(events) + "data: [DONE]\n\n", content_type=SSE_CONTENT_TYPE)

    def _headers(self, request: web.Request) -> dict[str, str]:
        headers = self._policy.headers(request.headers)
        headers["Content-Type"] = "application/json"
        key = self.config.api_key.get_secret_value() if self.config.api_key is not None else None
        if self.config.provider is LLMProvider.ANTHROPIC:
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
        self, request: web.Request, target: str, stream: bool, data: bytes, call: Call
    ) -> web.StreamResponse:
        limit = self.config.timeout_seconds
        # A stream may legitimately run longer than the timeout; it is bounded by silence instead.
        timeout = aiohttp.ClientTimeout(total=None if stream else limit, sock_connect=limit, sock_read=limit)
        try:
            async with self._client().post(
                target, data=data, headers=self._headers(request), timeout=timeout
            ) as upstream:
                content_type = upstream.headers.get("Content-Type", "application/json")
                if stream and upstream.status == 200 and content_type.startswith(SSE_CONTENT_TYPE):
                    return await self._relay(request, upstream, content_type, call)
                body = await _read_limited(upstream.content, MAX_RESPONSE_BYTES)
        except TimeoutError:
            raise ProxyError(504, "upstream_timeout", f"the LLM provider did not answer within {limit:g} s") from None
        except aiohttp.ClientError as exc:
            raise ProxyError(502, "upstream_error", f"the LLM provider could not be reached: {exc}") from None
        call.status, call.answer_bytes = upstream.status, len(body)
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
        call: Call,
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
        call.stream = response
        try:
            await response.prepare(request)
            relaying = True
        except ConnectionError:
            # The container hung up before the first event: the provider still bills the call, so its usage is
            # read to the end as below (else a run could spend any number of prompts on its budget for nothing).
            relaying = False
        scanner = SseUsageScanner(call.usage)
        async for chunk in upstream.content.iter_any():
            scanner.feed(chunk)
            call.answer_bytes += len(chunk)
            if relaying:
                try:
                    await response.write(chunk)
                except ConnectionError:
                    # The container hung up. Read on: the usage comes in the last events, and a stream cut
                    # just before them would otherwise cost the run nothing. The output cap bounds the rest.
                    relaying = False
        scanner.close()
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response


async def _read_limited(content: aiohttp.StreamReader, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise ProxyError(502, "upstream_response_too_large", f"the LLM provider's answer is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
