"""Token counting for the LLM proxy: the usage in a provider's answer or stream event, in any provider's shape.

`Usage` reads a whole JSON answer or one event; `SseUsageScanner` reads a server-sent event stream as
it is relayed, so a streamed call is counted without holding the stream back.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A partial line longer than this is dropped unread. The same 8 MiB as the proxy's request-body limit
# (MAX_BODY_BYTES): no usage event comes near it, and a stream without newlines cannot grow the buffer.
MAX_EVENT_LINE_BYTES = 8 * 1024 * 1024


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    reported: bool = False  # the provider gave a count (a call without one is counted estimated)

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
            self.reported = True
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        if isinstance(completion, int):
            self.output_tokens = completion
            self.reported = True


class SseUsageScanner:
    """Reads `data:` lines of a server-sent event stream as they pass and keeps the latest usage seen."""

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_EVENT_LINE_BYTES:
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
