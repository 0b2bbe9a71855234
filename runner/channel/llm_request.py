"""One LLM call's request as the proxy forwards it: the container's body made safe by the policy
(runner/channel/llm_policy.py), with the chat's follow-ups, serialized once, in a worker thread.

The run's budget and its chat's allowance hold what is forwarded, not what the container sent: the
follow-ups the host adds (up to ten of 2,000 characters) go to every call, so sixteen tiny calls at once each
held 81 tokens and used 5,000. The bytes held for are the bytes sent (JSON escapes every non-ASCII character,
so dense text holds more, as it costs more).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from runner.channel.bounded_json import BodyRefused, BodyTooLarge, read_measured
from runner.channel.llm_policy import (
    INVALID_REQUEST,
    MAX_REQUEST_VALUES,
    RequestPolicy,
    Sanitized,
    objects,
    parse_body,
    with_followups,
)
from runner.channel.llm_upstream import Upstream
from runner.channel.proxy_error import ProxyError

# An image's bytes do not bound what it is billed (a 304-byte PNG of 1092x1092 is billed about 1,600 tokens): each
# is held at the most a provider bills one, after its own resizing (Anthropic about 1,600; OpenAI's patch-based
# models up to about 3,800).
IMAGE_HOLD_TOKENS = 4_000
IMAGE_BLOCKS = frozenset({"image", "image_url", "input_image"})
# Billed by length or pages the host cannot know before it sends them: refused (the subagent's tools send none).
UNBOUNDED_BLOCKS = frozenset({"document", "file", "input_audio", "input_file", "audio"})


@dataclass(frozen=True, slots=True)
class Forwarded:
    """The call as the provider gets it: the sanitized payload with the follow-ups, its bytes, and what its images
    may cost beyond their bytes."""

    sanitized: Sanitized
    data: bytes
    media_tokens: int = 0

    @property
    def payload(self) -> dict[str, Any]:
        return self.sanitized.payload

    @property
    def output_cap(self) -> int:
        return self.sanitized.output_cap


async def read_body(request: web.Request, max_body_bytes: int) -> bytes:
    """The body, measured as it arrives (runner/channel/bounded_json.py): one over the caps is refused at the
    first piece that shows it, unread beyond."""
    try:
        return await read_measured(request, max_body_bytes, MAX_REQUEST_VALUES)
    except BodyTooLarge:
        raise ProxyError(413, "request_too_large", f"request body is over {max_body_bytes} bytes") from None
    except BodyRefused as exc:
        raise ProxyError(400, INVALID_REQUEST, f"request body refused: {exc}") from None


def prepared(
    policy: RequestPolicy, upstream: Upstream, path: str, body: bytes, followups: list[str], remaining_tokens: int
) -> Forwarded:
    """Blocking (parsing and serializing up to 8 MB): the call's forwarded form, its output capped by
    `remaining_tokens` (what the run has left before this call's own input is held)."""
    sanitized = policy.sanitize(path, parse_body(body), max(1, remaining_tokens))
    payload = upstream.outgoing(path, with_followups(sanitized.payload, followups))
    media = IMAGE_HOLD_TOKENS * _images([payload.get("messages"), payload.get("system")])
    return _serialized(replace(sanitized, payload=payload), media)


def recapped(policy: RequestPolicy, call: Forwarded, output_cap: int) -> Forwarded:
    """Blocking: the same call with a lower output cap (once its input is held, less may be left for output)."""
    return _serialized(policy.recapped(call.sanitized, output_cap), call.media_tokens)


def _serialized(sanitized: Sanitized, media_tokens: int) -> Forwarded:
    return Forwarded(sanitized, json.dumps(sanitized.payload).encode(), media_tokens)


def _images(value: object) -> int:
    """The image blocks in the conversation, at any depth (a tool's result may hold some; a tool call's input is the
    model's own arguments, not content); ProxyError for a block whose cost cannot be bounded before it is sent."""
    count = 0
    for item in objects(value, skip=lambda block: block.get("type") == "tool_use"):
        kind = item.get("type")
        if kind in IMAGE_BLOCKS:
            count += 1
        elif kind in UNBOUNDED_BLOCKS:
            raise ProxyError(
                400, INVALID_REQUEST, f"`{kind}` content is refused: its cost cannot be bounded before it is sent"
            )
    return count
