"""A scripted LLM server on a Unix socket, standing in for the LLM proxy.

It speaks OpenAI chat completions (`/v1/chat/completions`) and Anthropic messages (`/v1/messages`).
Each request gets the next scripted reply (a tool call or final text) and is recorded, so a test can
check what the agent sent. Serves the container agent on the host and in a container (bind mount).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

SOCKET_MODE = 0o666  # the container's uid 1000 connects to a socket the test (maybe root) created


class Reply:
    """One scripted model response."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ToolCallReply(Reply):
    tool_name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TextReply(Reply):
    text: str


@dataclass
class ScriptedLLM:
    """Serve `replies` in order on `socket_path`; `requests` holds each request body received."""

    socket_path: Path
    replies: Sequence[Reply]
    model: str = "scripted-model"
    requests: list[dict[str, Any]] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    async def __aenter__(self) -> ScriptedLLM:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/messages", self._messages)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.socket_path)).start()
        os.chmod(self.socket_path, SOCKET_MODE)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self.socket_path.unlink(missing_ok=True)

    async def _chat_completions(self, request: web.Request) -> web.Response:
        index = await self._record(request)
        if index >= len(self.replies):
            return self._script_exhausted()
        return web.json_response(_completion(self.replies[index], index, self.model))

    async def _messages(self, request: web.Request) -> web.Response:
        index = await self._record(request)
        if index >= len(self.replies):
            return self._script_exhausted()
        return web.json_response(_anthropic_message(self.replies[index], index, self.model))

    async def _record(self, request: web.Request) -> int:
        self.requests.append(await request.json())
        return len(self.requests) - 1

    def _script_exhausted(self) -> web.Response:
        return web.json_response(
            {"error": {"message": f"script has only {len(self.replies)} replies", "type": "server_error"}},
            status=500,
        )


def _completion(reply: Reply, index: int, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if isinstance(reply, ToolCallReply):
        message["tool_calls"] = [
            {
                "id": f"call_{index}",
                "type": "function",
                "function": {"name": reply.tool_name, "arguments": json.dumps(reply.arguments)},
            }
        ]
        finish_reason = "tool_calls"
    elif isinstance(reply, TextReply):
        message["content"] = reply.text
        finish_reason = "stop"
    else:
        raise TypeError(f"unknown reply {reply!r}")
    return {
        "id": f"chatcmpl-{index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def _anthropic_message(reply: Reply, index: int, model: str) -> dict[str, Any]:
    if isinstance(reply, ToolCallReply):
        content = [{"type": "tool_use", "id": f"toolu_{index}", "name": reply.tool_name, "input": reply.arguments}]
        stop_reason = "tool_use"
    elif isinstance(reply, TextReply):
        content = [{"type": "text", "text": reply.text}]
        stop_reason = "end_turn"
    else:
        raise TypeError(f"unknown reply {reply!r}")
    return {
        "id": f"msg_{index}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }
