"""POST /run/model: one model request of a subagent's loop, made by the host.

The container keeps its agent loop and its conversation (pydantic-ai's messages as JSON) but imports
neither pydantic-ai nor a provider's SDK, which would cost it a second and more of CPU at every start
(bench: spawn, burst). The host has both loaded: it validates the conversation, builds the provider's
request and sends it on the run's own socket, so the LLM proxy's gate, budget, policy and usage records
apply to it exactly as to any call. Imported on a run's first step, not at the host's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from pydantic import ValidationError
from pydantic_ai.direct import model_request
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.tools import ToolDefinition

from container.protocol import ModelStep, TaskSpec
from runner.channel import bounded_json
from runner.channel.bounded_json import BodyRefused, first_error
from runner.channel.conversation_limits import ConversationLimits, ConversationRefused, check_conversation

PROXY_ORIGIN = "http://llm"  # any host: the transport goes to the socket
PLACEHOLDER_API_KEY = "unused"  # the proxy adds the key; the SDKs insist on one
LLM_REQUEST_TIMEOUT_SECONDS = 600.0
LLM_CONNECT_TIMEOUT_SECONDS = 10.0
# The SDK retries a failed request once; more would hide a broken provider behind minutes of back-off.
LLM_SDK_MAX_RETRIES = 1
MAX_REASON_CHARS = 500
# What a conversation may hold. pydantic-ai fetches files given by URL (image-url, document-url, ...) while
# it builds a request: on the host that would fetch whatever a container names, the host's network included.
REQUEST_PART_KINDS = frozenset({"user-prompt", "tool-return", "retry-prompt", "system-prompt"})
RESPONSE_PART_KINDS = frozenset({"text", "tool-call", "thinking"})
URL_KIND_SUFFIX = "-url"

T = TypeVar("T")


class StepFailed(Exception):
    """The step could not be made: the HTTP status for the container and the reason it shows."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def parse_step(body: bytes, limits: ConversationLimits) -> tuple[list[ModelMessage], ModelRequestParameters]:
    """The conversation and the tools of a step body. Blocking: milliseconds, bounded by `limits` whatever the
    body's size (its shape and the conversation's size are checked before anything is validated)."""
    try:
        raw = bounded_json.load(body, limits.max_values)
        check_conversation(raw.get("messages") if isinstance(raw, dict) else None, limits)
    except (BodyRefused, ConversationRefused) as exc:
        raise StepFailed(400, f"not a valid model step: {exc}") from None
    try:
        step = ModelStep.model_validate(raw)
        refuse_unsafe(step.messages)
        messages = ModelMessagesTypeAdapter.validate_python(step.messages)
    except ValidationError as exc:
        raise StepFailed(400, f"not a valid model step: {first_error(exc)}") from None
    tools = [
        ToolDefinition(name=tool.name, description=tool.description, parameters_json_schema=tool.parameters)
        for tool in step.tools
    ]
    return messages, ModelRequestParameters(function_tools=tools, allow_text_output=True)


def refuse_unsafe(messages: list[Any]) -> None:
    """StepFailed for a part the agent never writes, or a file by URL anywhere in the conversation."""
    for message in messages:
        kind = message.get("kind") if isinstance(message, dict) else None
        allowed = REQUEST_PART_KINDS if kind == "request" else RESPONSE_PART_KINDS
        parts = message.get("parts") if isinstance(message, dict) else None
        for part in parts if isinstance(parts, list) else []:
            part_kind = part.get("part_kind") if isinstance(part, dict) else None
            if part_kind not in allowed:
                raise StepFailed(400, f"not a valid model step: a {kind} may not hold a {str(part_kind)[:40]!r} part")
    pending: list[Any] = list(messages)
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            kind = item.get("kind")
            if isinstance(kind, str) and kind.endswith(URL_KIND_SUFFIX):
                raise StepFailed(400, f"not a valid model step: files by URL ({kind[:40]}) are not fetched by the host")
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


async def make_step(spec: TaskSpec, socket_path: Path, body: bytes, limits: ConversationLimits) -> bytes:
    """The model's response to a step body, as `{"response": ...}` JSON; raises StepFailed."""
    messages, parameters = await asyncio.to_thread(parse_step, body, limits)
    # The SDK's typed transform of a long conversation is seconds of CPU (15 s for 8 MiB, OpenAI): never on
    # the host's loop, so the whole request is made on a loop of its own.
    return await on_own_loop(_request(spec, socket_path, messages, parameters))


async def _request(
    spec: TaskSpec, socket_path: Path, messages: list[ModelMessage], parameters: ModelRequestParameters
) -> bytes:
    async with open_model(spec, socket_path) as model:
        try:
            response = await model_request(model, messages, model_request_parameters=parameters)
        except ModelHTTPError as exc:
            # The proxy's refusals (budget, policy, a closed run) and the provider's errors, with their reason.
            raise StepFailed(exc.status_code, f"the LLM answered HTTP {exc.status_code}: {_reason(exc.body)}") from None
        except Exception as exc:
            raise StepFailed(502, f"the LLM call failed: {type(exc).__name__}: {str(exc)[:MAX_REASON_CHARS]}") from None
    return dump_response(response)


async def on_own_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` on an event loop of its own in a thread of its own; cancelling the caller cancels it.

    Not the default executor: the call waits for the LLM proxy, which parses the very request in that
    executor, so a few steps at once would hold all its threads and wait on themselves."""
    caller = asyncio.get_running_loop()
    outcome: asyncio.Future[T] = caller.create_future()
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)  # the loop is not running yet: safe from this thread

    def deliver(result: T | None, error: BaseException | None) -> None:
        if outcome.done():
            return
        if error is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = loop.run_until_complete(task)
        except BaseException as exc:  # the step's own error, or its cancellation: the caller's to see
            error = StepFailed(499, "the model step was cancelled") if isinstance(exc, asyncio.CancelledError) else exc
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
        with contextlib.suppress(RuntimeError):  # the caller's loop has closed: nobody is waiting
            caller.call_soon_threadsafe(deliver, result, error)

    threading.Thread(target=run, name="model-step", daemon=True).start()
    try:
        return await outcome
    except asyncio.CancelledError:
        with contextlib.suppress(RuntimeError):  # the step's loop has closed: it is over already
            loop.call_soon_threadsafe(task.cancel)
        raise


def dump_response(response: ModelResponse) -> bytes:
    (encoded,) = ModelMessagesTypeAdapter.dump_python([response], mode="json")
    return json.dumps({"response": encoded}).encode()


@asynccontextmanager
async def open_model(spec: TaskSpec, socket_path: Path) -> AsyncIterator[Model]:
    """The model `spec` names, its SDK pointed at the LLM proxy on the run's socket."""
    timeout = httpx2.Timeout(LLM_REQUEST_TIMEOUT_SECONDS, connect=LLM_CONNECT_TIMEOUT_SECONDS)
    # Plain HTTP on a Unix socket: no TLS is ever made here. The default context would load the CA bundle,
    # 50 ms of CPU at every step (bench: burst); an empty trust store would refuse any TLS instead.
    no_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    transport = httpx2.AsyncHTTPTransport(uds=str(socket_path), verify=no_tls)
    async with httpx2.AsyncClient(transport=transport, timeout=timeout) as http_client:
        yield _build_model(spec, http_client, timeout)


def _build_model(spec: TaskSpec, http_client: httpx2.AsyncClient, timeout: httpx2.Timeout) -> Model:
    # Each SDK is imported only when used: a bot on one provider never loads the other.
    if spec.provider_kind == "anthropic":
        from anthropic import AsyncAnthropic
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        anthropic_client = AsyncAnthropic(
            api_key=PLACEHOLDER_API_KEY,
            base_url=PROXY_ORIGIN,
            http_client=http_client,
            timeout=timeout,
            max_retries=LLM_SDK_MAX_RETRIES,
        )
        return AnthropicModel(spec.model, provider=AnthropicProvider(anthropic_client=anthropic_client))

    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    openai_client = AsyncOpenAI(
        api_key=PLACEHOLDER_API_KEY,
        base_url=f"{PROXY_ORIGIN}/v1",
        http_client=http_client,
        timeout=timeout,
        max_retries=LLM_SDK_MAX_RETRIES,
    )
    return OpenAIChatModel(spec.model, provider=OpenAIProvider(openai_client=openai_client))


def _reason(body: object) -> str:
    """The message of a provider-style error body ({"error": {"message": ...}}, or the `error` object alone, as
    the OpenAI SDK hands it on), else the body itself."""
    error: Any = body.get("error", body) if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    text = message if isinstance(message, str) else json.dumps(body, default=str)
    return text[:MAX_REASON_CHARS]
