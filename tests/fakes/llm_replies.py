"""Response bodies for the fake LLM server, in OpenAI Chat Completions and Anthropic Messages shape.

Builders leave `model` out unless given: the server fills in the model the request asked for.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

JsonDict = dict[str, Any]

DEFAULT_INPUT_TOKENS = 10
DEFAULT_OUTPUT_TOKENS = 5
# Streamed text arrives in pieces of this many characters, like a model's deltas.
STREAM_PIECE_CHARS = 8


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


# --- OpenAI Chat Completions -----------------------------------------------------------------------


def openai_text(
    text: str,
    *,
    model: str | None = None,
    prompt_tokens: int = DEFAULT_INPUT_TOKENS,
    completion_tokens: int = DEFAULT_OUTPUT_TOKENS,
    finish_reason: str = "stop",
) -> JsonDict:
    """A chat.completion whose assistant message is `text`."""
    message = {"role": "assistant", "content": text, "refusal": None}
    return _openai_completion(message, finish_reason, model, prompt_tokens, completion_tokens)


def openai_tool_call(
    name: str,
    arguments: Mapping[str, Any] | str,
    *,
    call_id: str | None = None,
    text: str | None = None,
    model: str | None = None,
    prompt_tokens: int = DEFAULT_INPUT_TOKENS,
    completion_tokens: int = DEFAULT_OUTPUT_TOKENS,
) -> JsonDict:
    """A chat.completion calling one function; `arguments` go out as a JSON string, as OpenAI sends them."""
    message = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "tool_calls": [
            {
                "id": call_id or _new_id("call_"),
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(dict(arguments)),
                },
            }
        ],
    }
    return _openai_completion(message, "tool_calls", model, prompt_tokens, completion_tokens)


def _openai_completion(
    message: JsonDict, finish_reason: str, model: str | None, prompt_tokens: int, completion_tokens: int
) -> JsonDict:
    body: JsonDict = {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    if model is not None:
        body["model"] = model
    return body


def openai_stream_chunks(
    completion: JsonDict, *, include_usage: bool, piece_chars: int = STREAM_PIECE_CHARS
) -> list[JsonDict]:
    """The chat.completion.chunk events a streaming server would send for `completion`."""
    base: JsonDict = {k: completion[k] for k in ("id", "created", "model") if k in completion}
    base["object"] = "chat.completion.chunk"
    choice = completion["choices"][0]
    message = choice["message"]

    def chunk(delta: JsonDict, finish_reason: str | None = None) -> JsonDict:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    content = message.get("content") or ""
    chunks += [chunk({"content": content[i : i + piece_chars]}) for i in range(0, len(content), piece_chars)]
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": completion.get("usage")})
    return chunks


# --- Anthropic Messages ----------------------------------------------------------------------------


def anthropic_text(
    text: str,
    *,
    model: str | None = None,
    input_tokens: int = DEFAULT_INPUT_TOKENS,
    output_tokens: int = DEFAULT_OUTPUT_TOKENS,
) -> JsonDict:
    """A Messages API reply whose only content block is `text`."""
    return _anthropic_message([{"type": "text", "text": text}], "end_turn", model, input_tokens, output_tokens)


def anthropic_tool_use(
    name: str,
    tool_input: Mapping[str, Any],
    *,
    tool_use_id: str | None = None,
    text: str | None = None,
    model: str | None = None,
    input_tokens: int = DEFAULT_INPUT_TOKENS,
    output_tokens: int = DEFAULT_OUTPUT_TOKENS,
) -> JsonDict:
    """A Messages API reply that uses one tool (optionally after some text)."""
    content: list[JsonDict] = [{"type": "text", "text": text}] if text else []
    content.append(
        {"type": "tool_use", "id": tool_use_id or _new_id("toolu_"), "name": name, "input": dict(tool_input)}
    )
    return _anthropic_message(content, "tool_use", model, input_tokens, output_tokens)


def _anthropic_message(
    content: list[JsonDict], stop_reason: str, model: str | None, input_tokens: int, output_tokens: int
) -> JsonDict:
    body: JsonDict = {
        "id": _new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
    if model is not None:
        body["model"] = model
    return body
