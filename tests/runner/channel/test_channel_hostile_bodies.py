"""The reviewer's attack on the run channel: bodies of millions of tiny values sent to every endpoint. Each is
refused before it is validated (no pydantic-ai messages built, memory within a few copies of the body), the
refusal names the cap, and a run that keeps sending them is stopped."""

from __future__ import annotations

import asyncio
import json
import socket
import tracemalloc
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic_ai.messages import ModelMessagesTypeAdapter

from container.protocol import (
    MAX_RUN_BODY_BYTES,
    MAX_SESSION_BYTES,
    MAX_STEP_BYTES,
    MESSAGE_PATH,
    MODEL_PATH,
    RunResult,
    TaskSpec,
)
from runner.channel import model_step, session_history
from runner.channel.conversation_limits import MAX_PARTS_PER_MESSAGE, ConversationLimits
from runner.channel.llm_policy import parse_body
from runner.channel.llm_proxy import MAX_BYTES_IN_FLIGHT
from runner.channel.model_step import StepFailed, parse_step
from runner.channel.proxy_error import ProxyError
from runner.channel.run_api import ChannelRefused
from runner.channel.run_endpoint import EXTRA_MODEL_STEPS, MAX_INVALID_REQUESTS, RunInbox
from runner.channel.sessions import SessionRejected, clean
from runner.runs.live_runs import LiveRun, StopReason
from tests.runner.channel.run_api_client import Request, exchange, exchange_raw
from tests.runner.channel.run_api_server import Recorder, serve

MIB = 1024 * 1024
TASK = TaskSpec(run_id="run-hostile1", task="t", label="l", max_steps=50)
LIMITS = ConversationLimits.for_task(TASK, EXTRA_MODEL_STEPS)


def empty_objects(size: int, wrapper: bytes = b'{"messages":[%s],"tools":[]}') -> bytes:
    """The reproduction: as many `{}` as fit in `size` bytes, inside `wrapper`."""
    count = (size - len(wrapper)) // 3
    return wrapper.replace(b"%s", b"{}," * count + b"{}")


def prompt(text: str) -> dict[str, Any]:
    return {"kind": "request", "parts": [{"part_kind": "user-prompt", "content": text}]}


@pytest.fixture
def never_validated(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fails the test if pydantic-ai's message validation is reached; the list records attempts."""
    reached: list[str] = []

    class Spy:
        def validate_python(self, *args: Any, **kwargs: Any) -> Any:
            reached.append("validate_python")
            raise AssertionError("a hostile body reached pydantic-ai's validation")

        def validate_json(self, *args: Any, **kwargs: Any) -> Any:
            reached.append("validate_json")
            raise AssertionError("a hostile body reached pydantic-ai's validation")

    monkeypatch.setattr(model_step, "ModelMessagesTypeAdapter", Spy())
    monkeypatch.setattr(session_history, "ModelMessagesTypeAdapter", Spy())
    return reached


def peak_bytes(work: Any) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_reproduction_step_is_refused_unbuilt(never_validated: list[str]) -> None:
    body = empty_objects(MAX_STEP_BYTES - 100)

    def refuse() -> None:
        with pytest.raises(StepFailed, match="over the limit of") as refused:
            parse_step(body, LIMITS)
        assert refused.value.status == 400

    assert peak_bytes(refuse) < 3 * len(body)  # on main: 2.8 million dicts and as many errors, 4.7 GB
    assert never_validated == []


def test_the_reproduction_session_is_refused_unbuilt(never_validated: list[str]) -> None:
    body = empty_objects(MAX_SESSION_BYTES - 100, b"[%s]")
    with pytest.raises(SessionRejected, match="over the limit of"):
        clean(body, 200, LIMITS)
    assert never_validated == []


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([prompt("hi")] * (LIMITS.max_messages + 1), f"over this run's limit of {LIMITS.max_messages}"),
        ([{"kind": "request", "parts": [{}] * (MAX_PARTS_PER_MESSAGE + 1)}], "parts, over the limit of 64"),
        ([{"kind": "request", "parts": [{}] * MAX_PARTS_PER_MESSAGE}] * 50, "message parts"),
        ([{"kind": "request", "parts": [{"part_kind": "user-prompt", "content": ["x"] * 5_000}]}], "message parts"),
    ],
)
def test_a_conversation_larger_than_the_run_can_write_is_refused(
    never_validated: list[str], messages: list[Any], reason: str
) -> None:
    body = json.dumps({"messages": messages, "tools": []}).encode()
    with pytest.raises(StepFailed, match=reason):
        parse_step(body, LIMITS)
    with pytest.raises(SessionRejected, match=reason):
        clean(json.dumps(messages).encode(), 200, LIMITS)
    assert never_validated == []


def test_a_conversation_as_long_as_the_run_may_write_is_taken() -> None:
    call = {"part_kind": "tool-call", "tool_name": "bash", "args": {"command": "ls -la"}, "tool_call_id": "c"}
    back = {"part_kind": "tool-return", "tool_name": "bash", "content": "a.txt\n" * 500, "tool_call_id": "c"}
    steps = (LIMITS.max_messages - 2) // 2
    messages = [
        prompt("go"),
        *([{"kind": "response", "parts": [call] * 4}, {"kind": "request", "parts": [back]}] * steps),
    ]
    parsed, _ = parse_step(json.dumps({"messages": messages, "tools": []}).encode(), LIMITS)
    assert len(parsed) == len(messages)


def test_the_llm_proxy_refuses_the_same_body_on_its_own_paths() -> None:
    body = empty_objects(MAX_STEP_BYTES - 100)
    with pytest.raises(ProxyError) as refused:
        parse_body(body)
    assert refused.value.status == 400 and "over the limit of" in str(refused.value)


async def test_a_run_that_keeps_sending_invalid_bodies_is_stopped() -> None:
    live, inbox = live_inbox()
    body = empty_objects(MIB)
    for sent in range(1, MAX_INVALID_REQUESTS + 1):
        assert live.stop_reason is None
        with pytest.raises(ChannelRefused) as refused:
            await inbox.model_step(body) if sent % 2 else await inbox.session(body)
        assert refused.value.status == 400
    assert live.stop_reason is StopReason.INVALID_REQUESTS
    assert live.stop_requested.is_set()


async def test_an_invalid_progress_message_is_counted_against_the_run() -> None:
    recorder = Recorder()
    junk = b'{"message_id": "msg-000001", "text": "hi", "junk": [' + b"{}," * (MAX_RUN_BODY_BYTES // 4) + b"{}]}"

    async def post(sock: Path) -> Any:
        return await exchange(sock, Request("POST", MESSAGE_PATH, junk))

    answer = await serve(recorder, post)
    assert answer.status == 400
    assert recorder.messages == []
    assert recorder.invalid_reasons == ["not a valid ProgressMessage: over the limit of 64 JSON values"]


def test_valid_history_json_still_round_trips() -> None:
    history = ModelMessagesTypeAdapter.validate_python([prompt("hello")])
    kept = clean(ModelMessagesTypeAdapter.dump_json(history), 200, LIMITS)
    assert json.loads(kept)[0]["parts"][0]["content"] == "hello"


# --- found by review: what is refused must be refused before it is read -----------------------------------


def live_inbox(max_steps: int = 50) -> tuple[LiveRun, RunInbox]:
    task = TaskSpec(run_id="run-hostile2", task="t", label="l", max_steps=max_steps)
    live = LiveRun(id=task.run_id, chat_id=1, turn_id=None, label="l")
    inbox = RunInbox(
        live,
        task,
        socket_path=Path("/unused"),
        runs=cast(Any, None),
        delivery=cast(Any, None),
        max_messages=1,
        session_max_messages=10,
        files=cast(Any, None),  # these runs never reach their files
    )
    return live, inbox


async def serve_inbox(inbox: RunInbox, requests: list[Request]) -> list[Any]:
    async def send_all(sock: Path) -> list[Any]:
        return [await exchange(sock, request) for request in requests]

    answers: list[Any] = await serve(inbox, send_all)
    return answers


async def test_steps_over_the_limit_are_refused_unread_and_stop_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    live, inbox = live_inbox(max_steps=1)

    async def answered(*args: Any) -> bytes:
        return b'{"response": {}}'

    monkeypatch.setattr(model_step, "make_step", answered)
    step = json.dumps({"messages": [prompt("go")], "tools": []}).encode()
    for _ in range(1 + EXTRA_MODEL_STEPS):  # what the run may ask for
        assert await inbox.model_step(step) == b'{"response": {}}'
    big = json.dumps({"messages": [prompt("x" * (MAX_STEP_BYTES - 1_000))], "tools": []}).encode()
    answers = await serve_inbox(inbox, [Request("POST", MODEL_PATH, big)] * 4)

    assert [a.status for a in answers[:MAX_INVALID_REQUESTS]] == [429] * MAX_INVALID_REQUESTS
    assert answers[-1].status == 403  # stopped: refused as such
    assert all(a.sent < len(big) for a in answers)  # not one of them was read to its end
    assert live.stop_reason is StopReason.INVALID_REQUESTS


async def test_a_stopped_run_gets_no_more_steps_or_sessions_but_its_result_is_taken() -> None:
    live, inbox = live_inbox()
    live.request_stop(StopReason.TOKEN_BUDGET)
    with pytest.raises(ChannelRefused, match="being stopped") as step:
        await inbox.model_step(b"{}")
    with pytest.raises(ChannelRefused, match="being stopped"):
        await inbox.session(b"[]")
    assert step.value.status == 403
    assert await inbox.result(RunResult(status="completed", result="late")) == "received"  # the stop decides


async def test_bodies_held_at_once_by_one_run_are_bounded() -> None:
    # Heads that announce 8 MB bodies, their bodies not sent: each holds its size until answered.
    recorder = Recorder()
    head = f"POST {MODEL_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_STEP_BYTES}\r\n\r\n".encode()

    async def hold_then_one_more(sock: Path) -> Any:
        loop = asyncio.get_running_loop()
        held = []
        try:
            for _ in range(MAX_BYTES_IN_FLIGHT // MAX_STEP_BYTES):
                conn = socket.socket(socket.AF_UNIX)
                conn.setblocking(False)
                await loop.sock_connect(conn, str(sock))
                await loop.sock_sendall(conn, head)
                held.append(conn)
            await asyncio.sleep(0.2)  # the server has taken every head (a head is one read)
            return await exchange_raw(sock, head, [b"{}"])
        finally:
            for conn in held:
                conn.close()

    answer = await serve(recorder, hold_then_one_more)
    assert answer.status == 429
    assert recorder.invalid_reasons == [f"run run-aaaaaa has {MAX_BYTES_IN_FLIGHT} bytes of requests in flight already"]


def test_a_tool_schema_of_megabytes_of_non_ascii_is_refused_cheaply(never_validated: list[str]) -> None:
    schema = {"type": "object", "description": "\U0001f600" * 2_000_000}
    body = json.dumps({"messages": [prompt("go")], "tools": [{"name": "t", "description": "", "parameters": schema}]})

    def refuse() -> None:
        with pytest.raises(StepFailed, match="over 8000 characters"):
            parse_step(body.encode(), LIMITS)

    encoded = len(body.encode())
    assert peak_bytes(refuse) < 3 * encoded  # json.dumps escaped it to 25 MB in one call holding the GIL


async def test_the_llm_proxys_own_paths_refuse_the_reproduction_unread_and_count_it() -> None:
    recorder = Recorder()
    body = empty_objects(900 * 1024)  # under the test proxy's 1 MB limit for provider requests

    async def post_three(sock: Path) -> list[Any]:
        return [await exchange(sock, Request("POST", "/v1/chat/completions", body)) for _ in range(3)]

    answers = await serve(recorder, post_three)
    assert [a.status for a in answers] == [400, 400, 400]
    assert all(a.sent < len(body) for a in answers)  # refused at the first piece, the rest never read
    assert len(recorder.invalid_reasons) == 3 and "over the limit of" in recorder.invalid_reasons[0]
