"""Stall case (b): a subagent at its limits, and the helper process that plays its container.

The helper (`python -m bench.stall_subagent`, started by the host through `container_process()`) is the
real container.channel.RunChannel on the run's socket. For each run it fetches the task, sends every
progress message (MAX_PROGRESS_CHARS each) at once, hands back a valid pydantic-ai session just under
MAX_SESSION_BYTES and reports a MAX_RESULT_CHARS result, as fast as it can. On the host, `Containers` is the
in-memory runtime's behaviour (each started container is one job for the helper) and `subagent_work` is the
window: spawn request written → the run settled and cleaned up (→ the chat's outbox sent, if `drain`).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import poll_until
from bench.stall_peer import WAIT_SECONDS, Peer, failure, reply
from container.protocol import (
    CHANNEL_DIR,
    CHANNEL_SOCKET_FILE,
    MAX_PROGRESS_CHARS,
    MAX_RESULT_CHARS,
    MAX_SESSION_BYTES,
    SpawnRequest,
)
from crewbot.app import App
from runner.ipc.requests import write_spawn_request
from runner.runtimes.runtime import LABEL_RUN_ID
from runner.service import SubagentService
from tests.fakes.memory_runtime import MemoryContainer

DEFAULT_MAX_MESSAGES = 10  # SUBAGENT_MAX_MESSAGES' default
CEILING_MAX_MESSAGES = 1_000  # the most SUBAGENT_MAX_MESSAGES allows
SESSION_MARGIN_BYTES = 16 * 1024  # the session sent is this much under MAX_SESSION_BYTES, or less
WATCH_SECONDS = 0.02  # how often the host side looks at an in-memory state (no I/O) to end a window
OUTBOX_POLL_SECONDS = 0.05  # how often it asks the store whether the chat's outbox is empty


# --- the container process ------------------------------------------------------------------------------


def _prose(chars: int, seed: int) -> str:
    """Markdown-ish text of exactly `chars` characters, as an agent writes it (bold, code, lists)."""
    words = ["build", "**passed**", "`make test`", "the", "module", "report", "- item", "error", "fixed", "and"]
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        line = " ".join(rng.choice(words) for _ in range(12)) + "\n"
        parts.append(line)
        size += len(line)
    return "".join(parts)[:chars]


def _session_bytes(limit: int) -> bytes:
    """A valid pydantic-ai history of tool calls and their output, just under `limit` bytes as JSON."""
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    def step(i: int) -> list[ModelMessage]:
        call_id = f"call_{i:06d}"
        output = "".join(f"line {j} of step {i}: compiling module_{j}.py ... ok\n" for j in range(30))
        return [
            ModelResponse(
                parts=[
                    TextPart(content=f"Step {i}: running the next command and reading its output. " * 4),
                    ToolCallPart(tool_name="bash", args={"command": f"make -C build target_{i}"}, tool_call_id=call_id),
                ],
                model_name="offline-subagent",
            ),
            ModelRequest(parts=[ToolReturnPart(tool_name="bash", content=output, tool_call_id=call_id)]),
        ]

    per_step = len(ModelMessagesTypeAdapter.dump_json(step(0)))
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(content="Build everything and report.")])]
    for i in range(limit // per_step + 1):
        if i and i % 40 == 0:
            messages.append(ModelRequest(parts=[UserPromptPart(content=f"Keep going ({i} steps so far).")]))
        messages += step(i)
    data = ModelMessagesTypeAdapter.dump_json(messages)
    while len(data) > limit:
        messages = messages[:-2]
        data = ModelMessagesTypeAdapter.dump_json(messages)
    return data


async def _act(command: dict[str, Any], session: bytes, progress: str, result: str) -> dict[str, Any]:
    """One run's container: task, every progress message at once, the session, the result."""
    from container.channel import ChannelRefused, RunChannel
    from container.task import RunResult

    count = int(command["messages"])
    started = time.monotonic()
    async with RunChannel(Path(command["socket"])) as channel:
        await channel.task()
        answers = await asyncio.gather(
            *(channel.send_message(f"p{i:07d}", progress) for i in range(count)),
            return_exceptions=True,
        )
        messages_done = time.monotonic()
        await channel.save_session(session)
        session_done = time.monotonic()
        await channel.report(RunResult(status="completed", result=result))
    refused = [a for a in answers if isinstance(a, ChannelRefused)]
    failed = [a for a in answers if isinstance(a, BaseException) and not isinstance(a, ChannelRefused)]
    if failed:
        raise RuntimeError(f"{len(failed)} progress message(s) failed: {failed[0]!r}")
    return {
        "accepted": count - len(refused),
        "refused": len(refused),
        "started": started,
        "messages_done": messages_done,
        "session_done": session_done,
        "reported": time.monotonic(),
        "session_bytes": len(session),
    }


async def _container_loop() -> None:
    session = _session_bytes(MAX_SESSION_BYTES - SESSION_MARGIN_BYTES)
    progress = _prose(MAX_PROGRESS_CHARS, 1)
    result = _prose(MAX_RESULT_CHARS, 2)
    reply({"ready": True, "session_bytes": len(session)})
    while line := await asyncio.to_thread(sys.stdin.readline):
        try:
            answer = await _act(json.loads(line), session, progress, result)
        except Exception as exc:
            answer = failure(exc)
        reply(answer)


def main() -> int:
    asyncio.run(_container_loop())
    return 0


# --- the host's side ------------------------------------------------------------------------------------


def container_process() -> Peer:
    return Peer("container", __name__)


def _socket_of(container: MemoryContainer) -> Path:
    assert container.spec is not None
    mount = next(m for m in container.spec.mounts if m.target == CHANNEL_DIR)
    return mount.source / CHANNEL_SOCKET_FILE


class Containers:
    """The in-memory runtime's behaviour: each started container is one job for the container process."""

    def __init__(self, peer: Peer) -> None:
        self._peer = peer
        self.messages: dict[str, int] = {}  # run id -> progress messages its container sends
        self.done: dict[str, asyncio.Future[dict[str, Any]]] = {}

    def expect(self, run_id: str, messages: int) -> asyncio.Future[dict[str, Any]]:
        self.messages[run_id] = messages
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.done[run_id] = future
        return future

    async def behave(self, container: MemoryContainer) -> int | None:
        run_id = container.labels[LABEL_RUN_ID]
        try:
            answer = await self._peer.call(
                {"socket": str(_socket_of(container)), "messages": self.messages[run_id]}, WAIT_SECONDS
            )
        except BaseException as exc:
            if not self.done[run_id].done():
                self.done[run_id].set_exception(exc)
            raise
        self.done[run_id].set_result(answer)
        return 0


async def subagent_work(
    app: App, service: SubagentService, containers: Containers, chat_id: int, folder: str, messages: int, drain: bool
) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    run_id = f"stall-{secrets.token_hex(6)}"
    finished = containers.expect(run_id, messages)
    asked = time.monotonic()
    request = SpawnRequest(request_id=run_id, task="Build everything and report.", label="stall")
    await asyncio.to_thread(write_spawn_request, service.paths.ipc_root, folder, request)
    answer = await asyncio.wait_for(finished, WAIT_SECONDS)

    async def cleaned_up() -> bool | None:
        return True if run_id not in service.live else None

    async def outbox_empty() -> bool | None:
        return True if not await app.stores.outbox.pending(chat_id) else None

    await poll_until(cleaned_up, WAIT_SECONDS, "the run to be cleaned up", WATCH_SECONDS)
    cleaned = time.monotonic()
    if drain:
        await poll_until(outbox_empty, WAIT_SECONDS, "the chat's outbox to be sent", OUTBOX_POLL_SECONDS)
    record = await service.runs.get(run_id)
    if record is None or record.status != "completed":
        raise RuntimeError(f"run {run_id} ended {record.status if record else 'without a record'}")
    if answer["accepted"] != messages:
        raise RuntimeError(f"{answer['accepted']} of {messages} progress messages were accepted")
    phases = [
        ("spawn request → container", asked),
        ("progress messages", answer["started"]),
        ("session upload", answer["messages_done"]),
        ("result", answer["session_done"]),
        ("run settled and cleaned up", answer["reported"]),
        ("delivery" if drain else "after", cleaned),
    ]
    facts = {
        "run_id": run_id,
        "messages": messages,
        "session_bytes": answer["session_bytes"],
        "spawn_to_container_start_s": round(answer["started"] - asked, 4),
        "messages_s": round(answer["messages_done"] - answer["started"], 4),
        "session_s": round(answer["session_done"] - answer["messages_done"], 4),
        "result_s": round(answer["reported"] - answer["session_done"], 4),
        "reported_to_cleaned_up_s": round(cleaned - answer["reported"], 4),
        "spawn_to_sent_s": round(time.monotonic() - asked, 4) if drain else "not waited for",
    }
    return facts, phases


if __name__ == "__main__":
    sys.exit(main())
