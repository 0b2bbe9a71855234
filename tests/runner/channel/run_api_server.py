"""The run API served by the LLM proxy exactly as a run's channel is, with Recorder as the run's endpoint."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container.protocol import AskAnswer, AskQuestion, FileMeta, McpCall, ProgressMessage, RunResult, TaskSpec
from core.settings import LLMProvider
from runner.channel.conversation_limits import ConversationLimits
from runner.channel.llm_policy import RequestPolicy
from runner.channel.llm_proxy import LlmProxy, UpstreamConfig
from runner.channel.run_api import ChannelRefused, RunEndpoint
from runner.channel.run_endpoint import EXTRA_MODEL_STEPS
from runner.channel.run_file_desk import ReceivedFile

RUN = "run-aaaaaa"
SPEC = TaskSpec(run_id=RUN, task="count the files", label="count")
LLM_BODY_LIMIT = 1024 * 1024  # the proxy's own limit for LLM request bodies, small here to keep the test quick


# --- the endpoint ----------------------------------------------------------------------------------------


@dataclass
class Recorder:
    """A RunEndpoint that keeps what it was handed, or refuses everything with `refusal`."""

    refusal: ChannelRefused | None = None
    tasks: int = 0
    messages: list[ProgressMessage] = field(default_factory=list)
    sessions: list[bytes] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)
    questions: list[AskQuestion] = field(default_factory=list)
    steps: list[bytes] = field(default_factory=list)
    invalid_reasons: list[str] = field(default_factory=list)
    limits: ConversationLimits = field(default_factory=lambda: ConversationLimits.for_task(SPEC, EXTRA_MODEL_STEPS))

    def _gate(self) -> None:
        if self.refusal is not None:
            raise self.refusal

    # Files are tested with the real desk (tests/runner/channel/test_file_transfer.py): none here.
    max_file_bytes: int = 1024

    def offered_file(self, index: int) -> Path:
        raise ChannelRefused(404, "this run was offered no files")

    async def begin_upload(self, meta: FileMeta) -> Path | None:
        raise ChannelRefused(403, "this endpoint takes no files")

    async def file_received(self, meta: FileMeta, received: ReceivedFile) -> str:
        raise ChannelRefused(403, "this endpoint takes no files")

    async def abandon_upload(self, target: Path) -> None:
        return None

    # MCP calls are tested with the real desk (tests/runner/channel/test_mcp_desk.py): none here.
    async def mcp_call(self, call: McpCall) -> str:
        self._gate()
        raise ChannelRefused(404, "this run was offered no MCP tools")

    async def task(self) -> TaskSpec:
        self._gate()
        self.tasks += 1
        return SPEC

    async def message(self, message: ProgressMessage) -> str:
        self._gate()
        self.messages.append(message)
        return "sent"

    async def ask(self, question: AskQuestion) -> AskAnswer:
        self._gate()
        self.questions.append(question)
        return AskAnswer(outcome="answered", answer=question.options[0] if question.options else "yes", by="Alice")

    async def session(self, history_json: bytes) -> str:
        self._gate()
        self.sessions.append(history_json)
        return "kept"

    async def result(self, result: RunResult) -> str:
        self._gate()
        self.results.append(result)
        return "received"

    async def model_step(self, body: bytes) -> bytes:
        self._gate()
        self.steps.append(body)
        return b'{"response": {"kind": "response", "parts": [{"part_kind": "text", "content": "ok"}]}}'

    def invalid(self, status: int, reason: str) -> None:
        self.invalid_reasons.append(reason)

    def admit(self, path: str) -> None:
        """Decides after reading (the refusal, if any, comes from the method), as the property test expects."""

    def handed(self) -> list[object]:
        return [*self.messages, *self.sessions, *self.results, *self.steps]


# --- the server ------------------------------------------------------------------------------------------


class AlwaysLive:
    def is_live(self, run_id: str) -> bool:
        return True

    def followups(self, run_id: str) -> list[str]:
        return []


class NoUsage:
    async def record_usage(self, run_id: str, input_tokens: int, output_tokens: int, requests: int) -> None:
        return None


def new_proxy() -> LlmProxy:
    policy = RequestPolicy(LLMProvider.OFFLINE, "offline-subagent", allow_provider_tools=False)
    return LlmProxy(
        UpstreamConfig(LLMProvider.OFFLINE),
        AlwaysLive(),
        NoUsage(),
        policy=policy,
        max_tokens_per_run=1_000_000,
        max_body_bytes=LLM_BODY_LIMIT,
    )


async def serve(endpoint: RunEndpoint | None, work: Callable[[Path], Any]) -> Any:
    """Run `work(socket_path)` against a proxy serving one run with `endpoint`, as the manager opens it."""
    with tempfile.TemporaryDirectory(prefix="runapi-") as folder:
        proxy = new_proxy()
        sock = Path(folder) / "run.sock"
        await proxy.open_run(RUN, sock, endpoint=endpoint)
        try:
            return await work(sock)
        finally:
            await proxy.close()
