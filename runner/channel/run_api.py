"""The run API on a run's channel (`/run/...`): the host's side of task, progress messages, session, result.

Every body is bounded as it is read (never more than one byte past its limit), measured before it is parsed
(runner/channel/bounded_json.py) and validated against the contract's models; an invalid one is counted against
the run (its endpoint stops a run that sends a few). The run it speaks for is the socket it arrived on,
never anything in the body. What a run may do with an accepted request (its budgets, whether it is still
live) is the `RunEndpoint`'s decision.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel

from container.contract import WORKSPACE_PATH
from container.protocol import (
    ASK_PATH,
    FILES_PATH,
    MAX_RUN_BODY_BYTES,
    MAX_SESSION_BYTES,
    MAX_STEP_BYTES,
    MCP_PATH,
    MESSAGE_PATH,
    MODEL_PATH,
    RESULT_PATH,
    SESSION_PATH,
    TASK_PATH,
    AskAnswer,
    AskQuestion,
    McpCall,
    ProgressMessage,
    RunResult,
    TaskSpec,
)
from runner.channel import bounded_json
from runner.channel.bounded_json import BodyRefused, BodyTooLarge
from runner.channel.channel_answers import INVALID_STATUS, ChannelRefused, answer
from runner.channel.conversation_limits import ConversationLimits
from runner.channel.file_transfer import FileEndpoint, receive_file, serve_offered
from runner.channel.workspace_desk import handle_workspace

# The refusal and the answer live in runner/channel/channel_answers.py; most users import them from here.
__all__ = ["INVALID_STATUS", "ChannelRefused", "RunEndpoint", "answer", "handle_run_api"]

ModelT = TypeVar("ModelT", bound=BaseModel)

# A progress message or a result is a handful of fields: a body with more values than this is not one.
MAX_SMALL_BODY_VALUES = 64
MAX_SHOWN_CHARS = 100  # what a refusal echoes of the request (path, method, field name): the container chose it
_ROUTES = {
    TASK_PATH: "GET",
    MESSAGE_PATH: "POST",
    SESSION_PATH: "POST",
    RESULT_PATH: "POST",
    MODEL_PATH: "POST",
    FILES_PATH: "POST",
    ASK_PATH: "POST",
    MCP_PATH: "POST",
}
_OFFERED_PREFIX = f"{FILES_PATH}/"  # GET /run/files/<index>


class RunEndpoint(FileEndpoint, Protocol):
    """What one run's channel hands to the task manager. Methods raise ChannelRefused to say no."""

    @property
    def limits(self) -> ConversationLimits:
        """How big this run's conversation may be: a model step's or a session's body is measured against it."""

    async def task(self) -> TaskSpec: ...

    async def message(self, message: ProgressMessage) -> str: ...

    async def session(self, history_json: bytes) -> str: ...

    async def result(self, result: RunResult) -> str: ...

    async def ask(self, question: AskQuestion) -> AskAnswer:
        """The chat's answer to a question, once it has one (or none came in time, or the run is ending)."""

    async def model_step(self, body: bytes) -> bytes:
        """The model's response to one step of the agent's loop, as JSON (runner/channel/model_step.py)."""

    async def mcp_call(self, call: McpCall) -> str:
        """An offered MCP tool's result, the host making the call (runner/channel/mcp_desk.py)."""

    def invalid(self, status: int, reason: str) -> None:
        """A body was refused as invalid or over a cap (the endpoint may stop the run after a few)."""

    def admit(self, path: str) -> None:
        """Before a POST's body is read: raise ChannelRefused for what would be refused once read."""


async def handle_run_api(endpoint: RunEndpoint | None, request: web.Request) -> web.StreamResponse:
    """Serve one `/run/...` request for the run whose socket it came in on."""
    if endpoint is None:
        return answer(404, False, "this channel serves no run API")
    path, method = request.path, request.method
    try:
        if method == "POST" and _ROUTES.get(path) == "POST":
            endpoint.admit(path)
        if path.startswith(_OFFERED_PREFIX) and method == "GET":
            return await serve_offered(endpoint, request, path[len(_OFFERED_PREFIX) :])
        if path == FILES_PATH and method == "POST":
            return await receive_file(endpoint, request)
        if path == WORKSPACE_PATH:  # GET and PUT, only for a run that syncs its workspace (workspace_desk.py)
            return await handle_workspace(endpoint, request)
        if path == TASK_PATH and method == "GET":
            task = await endpoint.task()
            return web.Response(body=task.model_dump_json(), content_type="application/json")
        if path == MESSAGE_PATH and method == "POST":
            body = await _read(endpoint, request, MAX_RUN_BODY_BYTES, MAX_SMALL_BODY_VALUES, "ProgressMessage")
            return answer(200, True, await endpoint.message(_parse(endpoint, ProgressMessage, body)))
        if path == SESSION_PATH and method == "POST":
            body = await _read(endpoint, request, MAX_SESSION_BYTES, endpoint.limits.max_values, "session")
            return answer(200, True, await endpoint.session(body))
        if path == MODEL_PATH and method == "POST":
            body = await _read(endpoint, request, MAX_STEP_BYTES, endpoint.limits.max_values, "model step")
            return web.Response(body=await endpoint.model_step(body), content_type="application/json")
        if path == ASK_PATH and method == "POST":
            body = await _read(endpoint, request, MAX_RUN_BODY_BYTES, MAX_SMALL_BODY_VALUES, "AskQuestion")
            answered = await endpoint.ask(_parse(endpoint, AskQuestion, body))
            return web.Response(body=answered.model_dump_json(), content_type="application/json")
        if path == MCP_PATH and method == "POST":
            body = await _read(endpoint, request, MAX_RUN_BODY_BYTES, endpoint.limits.max_values, "McpCall")
            call = _parse(endpoint, McpCall, body, endpoint.limits.max_values)
            return answer(200, True, await endpoint.mcp_call(call))
        if path == RESULT_PATH and method == "POST":
            body = await _read(endpoint, request, MAX_RUN_BODY_BYTES, MAX_SMALL_BODY_VALUES, "RunResult")
            return answer(200, True, await endpoint.result(_parse(endpoint, RunResult, body)))
    except ChannelRefused as exc:
        return answer(exc.status, False, exc.reason)
    shown = path[:MAX_SHOWN_CHARS]
    if path in _ROUTES:
        return answer(405, False, f"{shown} takes {_ROUTES[path]}, not {method[:MAX_SHOWN_CHARS]}")
    return answer(404, False, f"{shown} is not part of the run API")


async def _read(endpoint: RunEndpoint, request: web.Request, limit: int, max_values: int, what: str) -> bytes:
    """The body, measured as it arrives: one over `limit` bytes is refused (413), one over `max_values` JSON
    values or nested too deeply (400, counted against the run) at the first piece that shows it, unread beyond."""
    try:
        return await bounded_json.read_measured(request, limit, max_values)
    except BodyTooLarge:
        raise ChannelRefused(413, f"the body is over the limit of {limit} bytes") from None
    except BodyRefused as exc:
        reason = f"not a valid {what}: {exc}"
        endpoint.invalid(INVALID_STATUS, reason)
        raise ChannelRefused(INVALID_STATUS, reason) from None


def _parse(endpoint: RunEndpoint, model: type[ModelT], body: bytes, max_values: int = MAX_SMALL_BODY_VALUES) -> ModelT:
    # Small bodies (512 KB at most, 64 values): the shape check and validation take a millisecond, on the loop.
    try:
        return bounded_json.validate(model, body, max_values)
    except BodyRefused as exc:
        reason = f"not a valid {model.__name__}: {exc}"
        endpoint.invalid(INVALID_STATUS, reason)
        raise ChannelRefused(INVALID_STATUS, reason) from None
