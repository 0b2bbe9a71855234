"""A scripted host on a Unix socket: the run channel as the container sees it.

It stands in for the host's end of a run's channel and serves both halves of it:

- the LLM paths (OpenAI chat completions `/v1/chat/completions`, Anthropic `/v1/messages`): each request
  gets the next scripted reply (a tool call or final text) and is recorded, so a test can check what the
  agent sent;
- the run API (`/run/task`, `/run/model`, `/run/message`, `/run/session`, `/run/result`, `/run/files`):
  served by the host's own handler (runner/channel/run_api.py, so bodies are bounded, parsed and answered
  exactly as the host does), with an endpoint that hands out `task` and records what it accepts. A model step
  is made by the host's own code (runner/channel/model_step.py), which sends the provider's request back to
  this socket's LLM paths, as the real host sends it to its LLM proxy. It enforces the task's progress-message
  budget (429, the host's reason) and refuses whatever path a test lists in `refusals`. The run's files are
  `files` (tests/container/fake_files.py): the offered bytes, and the uploads received.

Serves the container agent on the host and in a container (a bind-mounted socket folder).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web
from pydantic import ValidationError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from container.protocol import (
    ASK_PATH,
    FILES_PATH,
    MCP_PATH,
    MESSAGE_PATH,
    MODEL_PATH,
    RESULT_PATH,
    SESSION_PATH,
    TASK_PATH,
    AskAnswer,
    AskQuestion,
    FileMeta,
    McpCall,
    ProgressMessage,
    RunResult,
    TaskSpec,
)
from runner.channel.conversation_limits import ConversationLimits
from runner.channel.model_step import StepFailed, make_step
from runner.channel.run_api import ChannelRefused as HostRefusal
from runner.channel.run_api import handle_run_api
from runner.channel.run_endpoint import EXTRA_MODEL_STEPS
from runner.channel.run_file_desk import ReceivedFile
from tests.container.fake_files import FakeFiles

SOCKET_MODE = 0o666  # the container's uid 1000 connects to a socket the test (maybe root) created
LLM_MAX_BODY_BYTES = 8 * 1024 * 1024  # as the host's LLM proxy: a long prior history fits


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


@dataclass(frozen=True, slots=True)
class Refusal:
    """How the fake host says no to a run API path: the HTTP status and the reason the container sees."""

    status: int
    detail: str


@dataclass
class ScriptedLLM:
    """Serve `replies` in order and the run API for `task` on `socket_path`; record what arrives.

    `requests` holds each LLM request body; `messages`, `sessions` and `results` hold what the run API
    accepted (refused requests are not recorded). `task` None answers `GET /run/task` with 404.
    """

    socket_path: Path
    replies: Sequence[Reply]
    task: TaskSpec | None = None
    refusals: Mapping[str, Refusal] = field(default_factory=dict)  # run API path -> refusal
    model: str = "scripted-model"
    requests: list[dict[str, Any]] = field(default_factory=list)
    messages: list[ProgressMessage] = field(default_factory=list)
    messages_over_budget: int = 0  # messages refused as over the run's budget
    sessions: list[bytes] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)
    questions: list[AskQuestion] = field(default_factory=list)  # what ask_chat asked, in order
    answers: list[AskAnswer] = field(default_factory=list)  # the chat's answers, one per question, in order
    files: FakeFiles = field(default_factory=FakeFiles)  # the offered files, and the uploads that arrived
    mcp_answers: Mapping[str, str] = field(default_factory=dict)  # MCP tool name -> the host's result
    mcp_calls: list[McpCall] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    async def __aenter__(self) -> ScriptedLLM:
        endpoint = _FakeRunEndpoint(self)

        async def run_api(request: web.Request) -> web.StreamResponse:
            return await handle_run_api(endpoint, request)

        app = web.Application(client_max_size=LLM_MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_route("*", "/run/{path:.*}", run_api)
        self.files.open(self.task)
        self._runner = web.AppRunner(app, access_log=None)
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
        self.files.close()

    def saved_history(self) -> list[ModelMessage]:
        """The one session the run uploaded, as messages (fails the test unless there is exactly one)."""
        (session,) = self.sessions
        return ModelMessagesTypeAdapter.validate_json(session)

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


class _FakeRunEndpoint:
    """The host's `RunEndpoint` for the fake: budgets and refusals as the host's run inbox has them."""

    def __init__(self, host: ScriptedLLM) -> None:
        self._host = host
        self._message_ids: set[str] = set()

    def _refuse_if_told(self, path: str) -> None:
        refusal = self._host.refusals.get(path)
        if refusal is not None:
            raise HostRefusal(refusal.status, refusal.detail)

    async def task(self) -> TaskSpec:
        self._refuse_if_told(TASK_PATH)
        if self._host.task is None:
            raise HostRefusal(404, "this channel has no task")
        return self._host.task

    async def message(self, message: ProgressMessage) -> str:
        self._refuse_if_told(MESSAGE_PATH)
        if message.message_id in self._message_ids:
            return "already sent"
        budget = self._host.task.max_messages if self._host.task is not None else 0
        if len(self._host.messages) >= budget:
            self._host.messages_over_budget += 1
            raise HostRefusal(
                429, f"this run has sent its {budget} progress messages; put the rest in the final answer"
            )
        self._message_ids.add(message.message_id)
        self._host.messages.append(message)
        return "sent"

    async def ask(self, question: AskQuestion) -> AskAnswer:
        self._refuse_if_told(ASK_PATH)
        self._host.questions.append(question)
        if not self._host.answers:
            return AskAnswer(outcome="no_answer", detail="nobody answered within SUBAGENT_ASK_TIMEOUT_SECONDS")
        return self._host.answers.pop(0)

    async def session(self, history_json: bytes) -> str:
        self._refuse_if_told(SESSION_PATH)
        try:
            ModelMessagesTypeAdapter.validate_json(history_json)
        except ValidationError as exc:
            raise HostRefusal(400, f"session not kept: not a message history ({exc.error_count()} errors)") from None
        self._host.sessions.append(history_json)
        return "kept"

    async def model_step(self, body: bytes) -> bytes:
        self._refuse_if_told(MODEL_PATH)
        if self._host.task is None:
            raise HostRefusal(404, "this channel has no task")
        try:
            return await make_step(self._host.task, self._host.socket_path, body, self.limits)
        except StepFailed as exc:
            raise HostRefusal(exc.status, exc.reason) from None

    def invalid(self, status: int, reason: str) -> None:
        """The host's RunInbox counts these; the scripted host only serves."""

    def admit(self, path: str) -> None:
        """The scripted host refuses (if told to) once the body is read; an upload before it is read."""
        if path == FILES_PATH:
            self._host.files.admit_upload()

    # The run's files: tests/container/fake_files.py.

    @property
    def max_file_bytes(self) -> int:
        return self._host.files.max_file_bytes

    def offered_file(self, index: int) -> Path:
        return self._host.files.offered_file(index)

    async def begin_upload(self, meta: FileMeta) -> Path | None:
        return await self._host.files.begin_upload(meta)

    async def file_received(self, meta: FileMeta, received: ReceivedFile) -> str:
        return await self._host.files.file_received(meta, received)

    async def mcp_call(self, call: McpCall) -> str:
        self._refuse_if_told(MCP_PATH)
        self._host.mcp_calls.append(call)
        if call.tool not in self._host.mcp_answers:
            raise HostRefusal(404, f"{call.tool} is not a tool offered to this run")
        return self._host.mcp_answers[call.tool]

    async def abandon_upload(self, target: Path) -> None:
        await self._host.files.abandon_upload(target)

    @property
    def limits(self) -> ConversationLimits:
        task = self._host.task or TaskSpec(run_id="run-scripted", task="t", label="l")
        return ConversationLimits.for_task(task, EXTRA_MODEL_STEPS)

    async def result(self, result: RunResult) -> str:
        self._refuse_if_told(RESULT_PATH)
        if self._host.results:
            raise HostRefusal(409, "this run has reported its result already")
        self._host.results.append(result)
        return "received"


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
