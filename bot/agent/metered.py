"""Each model request of a main-agent turn, metered: admitted only while the turn's chat and the whole bot
have allowance left, holding its estimate until it settles to what the provider says it used.

The estimate is the request's size (its messages, instructions and tool definitions) in UTF-8 bytes, a token
each (a token covers at least one byte: a true upper bound however dense the text, which strangers write),
plus its output cap: the model settings' `max_tokens`, else OUTPUT_CAP_TOKENS. A provider that
reports no usage is counted at the estimate of what was sent and received, marked estimated. A request
that fails is released (nothing counted); one cancelled in flight (a merge, the turn's timeout, a Stop) is
counted, estimated: its input (the provider's count if it sent one, else the estimate: it has likely read
the prompt by then) and, for a stream, the output it streamed so far (the provider's count if it sent its
final one, else the text so far by the same rule, never less than what the provider said).

Imported on the first turn with the rest of pydantic-ai (bot/agent/llm_agent.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from bot.senses.image_prep import MAX_SIDE_PX, image_size
from bot.senses.vision import image_tokens
from core.allowances import Allowances, Reservation, tokens_of_bytes
from core.logging import get_logger
from core.store.spend import SpendKind

log = get_logger(__name__)

TokenCounter = Callable[[SpendKind, int, int], None]  # (kind, input, output) of each call counted: metrics

OUTPUT_CAP_TOKENS = 4_096  # a request's output when the model settings set no max_tokens (a typical default)


def _size(text: str) -> int:
    return len(text.encode("utf-8", errors="replace"))


def _part_size(part: Any) -> int:
    if isinstance(part, ToolCallPart):
        return _size(part.tool_name) + _size(part.args_as_json_str())
    if isinstance(part, ToolReturnPart):
        return _size(part.tool_name) + _size(part.model_response_str())
    if isinstance(part, RetryPromptPart):
        return _size(part.model_response())
    content = getattr(part, "content", "")
    if isinstance(content, str):
        return _size(content)
    if isinstance(content, Iterable):  # a user prompt's list: its text counts (files are not sized here)
        return sum(_size(item) for item in content if isinstance(item, str))
    return 0


def response_size(parts: Iterable[ModelResponsePart]) -> int:
    return sum(_part_size(part) for part in parts)


def request_size(messages: list[ModelMessage], parameters: ModelRequestParameters) -> int:
    """What a request sends, in UTF-8 bytes: every message's parts, the instructions and the tools."""
    total = 0
    for message in messages:
        if isinstance(message, ModelRequest):
            total += _size(message.instructions or "")
        total += sum(_part_size(part) for part in message.parts)
    for tool in [*parameters.function_tools, *parameters.output_tools]:
        total += _size(tool.name) + _size(tool.description or "") + _size(json.dumps(tool.parameters_json_schema))
    return total


def request_image_tokens(messages: list[ModelMessage], system: str, model_name: str) -> int:
    """What the request's images may be billed, by the provider's rule for their size (bot/senses/vision.py): their
    bytes do not bound it (a small JPEG of 1,568 px is billed about 3,000 tokens by Anthropic)."""
    total = 0
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if isinstance(part, UserPromptPart) and not isinstance(part.content, str):
                for item in part.content:
                    if isinstance(item, BinaryContent) and item.is_image:
                        width, height = image_size(item.data) or (MAX_SIDE_PX, MAX_SIDE_PX)
                        total += image_tokens(system, model_name, width, height)
    return total


def output_cap(model_settings: ModelSettings | None) -> int:
    cap = (model_settings or {}).get("max_tokens")
    return cap if isinstance(cap, int) and cap > 0 else OUTPUT_CAP_TOKENS


def stopped_usage(prompt: int, partial: ModelResponse | None) -> tuple[int, int, bool]:
    """(input, output, estimated) of a request cancelled in flight, `partial` being what it streamed so far."""
    if partial is None:
        return prompt, 0, True
    usage = partial.usage
    if partial.finish_reason is not None and usage.input_tokens > 0 and usage.output_tokens > 0:
        return usage.input_tokens, usage.output_tokens, False  # its final count came before the cancel
    used_in = usage.input_tokens if usage.input_tokens > 0 else prompt
    # A count sent mid-stream is the provider's first event's (Anthropic's message_start says 1 output token):
    # the text so far, a token a byte, is the bound.
    used_out = max(usage.output_tokens, tokens_of_bytes(response_size(partial.parts)))
    return used_in, used_out, True


class MeteredModel(WrapperModel):
    """Made per turn around the agent's model (passed as `model=` to its run): the chat and kind to count."""

    def __init__(
        self,
        wrapped: Model,
        allowances: Allowances,
        chat_id: int,
        kind: SpendKind,
        on_tokens: TokenCounter | None = None,
    ) -> None:
        super().__init__(wrapped)
        self._allowances = allowances
        self._chat_id = chat_id
        self._kind = kind
        self._on_tokens = on_tokens

    async def _reserve(
        self, messages: list[ModelMessage], model_settings: ModelSettings | None, parameters: ModelRequestParameters
    ) -> tuple[Reservation, int]:
        """Raises AllowanceSpent when nothing is left; else the hold and the request's input estimate."""
        prompt = tokens_of_bytes(request_size(messages, parameters))
        prompt += request_image_tokens(messages, self.wrapped.system, self.wrapped.model_name)
        held = await self._allowances.reserve(self._chat_id, self._kind, prompt + output_cap(model_settings))
        return held, prompt

    async def _settle(self, held: Reservation, response: ModelResponse, prompt: int) -> None:
        usage = response.usage
        estimated = bool(usage.unmeasured_requests) or (usage.input_tokens <= 0 and usage.output_tokens <= 0)
        used_in, used_out = usage.input_tokens, usage.output_tokens
        if estimated:
            used_in, used_out = prompt, tokens_of_bytes(response_size(response.parts))
            log.info("llm_usage_estimated", chat_id=self._chat_id, input_tokens=used_in, output_tokens=used_out)
        await self._count(held, used_in, used_out, estimated=estimated)

    async def _count(self, held: Reservation, input_tokens: int, output_tokens: int, *, estimated: bool) -> None:
        await self._allowances.settle(held, input_tokens, output_tokens, estimated=estimated)
        if self._on_tokens is not None:
            self._on_tokens(self._kind, input_tokens, output_tokens)

    async def _abandoned(
        self, held: Reservation, prompt: int, error: BaseException, partial: ModelResponse | None = None
    ) -> None:
        if isinstance(error, asyncio.CancelledError):
            used_in, used_out, estimated = stopped_usage(prompt, partial)
            # Shielded: the settling finishes even if the turn is cancelled again meanwhile.
            await asyncio.shield(self._count(held, used_in, used_out, estimated=estimated))
        else:
            await self._allowances.release(held)

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        held, prompt = await self._reserve(messages, model_settings, model_request_parameters)
        try:
            response = await self.wrapped.request(messages, model_settings, model_request_parameters)
        except BaseException as exc:
            await self._abandoned(held, prompt, exc)
            raise
        await self._settle(held, response, prompt)
        return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        held, prompt = await self._reserve(messages, model_settings, model_request_parameters)
        stream: StreamedResponse | None = None
        try:
            async with self.wrapped.request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as stream:
                yield stream
        except BaseException as exc:
            await self._abandoned(held, prompt, exc, None if stream is None else stream.get())
            raise
        await self._settle(held, stream.get(), prompt)
