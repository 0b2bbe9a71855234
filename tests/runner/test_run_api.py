"""The run API (`/run/...`) on a real Unix socket, served by the LLM proxy exactly as a run's channel is,
against hostile requests: random bytes, deep and huge JSON, wrong types, bodies over the limit with and
without a length, chunked uploads, unknown paths and methods.

The client is a raw socket speaking HTTP/1.1 by hand: an HTTP library would refuse to send some of these,
or stop at the server's early answer, and the test must count what the server really read.
"""

from __future__ import annotations

import asyncio
import json
import socket
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from container.protocol import (
    ID_PATTERN,
    MAX_RUN_BODY_BYTES,
    MAX_SESSION_BYTES,
    MESSAGE_PATH,
    RESULT_PATH,
    SESSION_PATH,
    TASK_PATH,
    ChannelAnswer,
    ProgressMessage,
    RunResult,
    TaskSpec,
)
from core.settings import LLMProvider
from runner.llm_policy import RequestPolicy
from runner.llm_proxy import LlmProxy, UpstreamConfig
from runner.run_api import ChannelRefused, RunEndpoint

RUN = "run-aaaaaa"
SPEC = TaskSpec(run_id=RUN, task="count the files", label="count")
LIMITS = {MESSAGE_PATH: MAX_RUN_BODY_BYTES, RESULT_PATH: MAX_RUN_BODY_BYTES, SESSION_PATH: MAX_SESSION_BYTES}
MODELS: dict[str, type[BaseModel]] = {MESSAGE_PATH: ProgressMessage, RESULT_PATH: RunResult}
ROUTES = {TASK_PATH: "GET", MESSAGE_PATH: "POST", SESSION_PATH: "POST", RESULT_PATH: "POST"}
LLM_BODY_LIMIT = 1024 * 1024  # the proxy's own limit for LLM request bodies, small here to keep the test quick
# What the kernel's socket buffers, asyncio's and aiohttp's read buffers hold beyond what the server has read.
BUFFER_SLACK = 2 * 1024 * 1024
EXCHANGE_TIMEOUT = 10.0
SEND_PIECE = 64 * 1024

Framing = Literal["length", "chunked"]


# --- the endpoint ----------------------------------------------------------------------------------------


@dataclass
class Recorder:
    """A RunEndpoint that keeps what it was handed, or refuses everything with `refusal`."""

    refusal: ChannelRefused | None = None
    tasks: int = 0
    messages: list[ProgressMessage] = field(default_factory=list)
    sessions: list[bytes] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)

    def _gate(self) -> None:
        if self.refusal is not None:
            raise self.refusal

    async def task(self) -> TaskSpec:
        self._gate()
        self.tasks += 1
        return SPEC

    async def message(self, message: ProgressMessage) -> str:
        self._gate()
        self.messages.append(message)
        return "sent"

    async def session(self, history_json: bytes) -> str:
        self._gate()
        self.sessions.append(history_json)
        return "kept"

    async def result(self, result: RunResult) -> str:
        self._gate()
        self.results.append(result)
        return "received"

    def handed(self) -> list[object]:
        return [*self.messages, *self.sessions, *self.results]


# --- a raw HTTP/1.1 client -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    body: bytes = b""
    framing: Framing = "length"
    piece: int = SEND_PIECE  # chunk size of a chunked upload


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int  # bytes of the parts the server's end took before it hung up (or all of them)


def head(method: str, target: str, framing: Framing, length: int) -> bytes:
    framing_header = f"Content-Length: {length}" if framing == "length" else "Transfer-Encoding: chunked"
    lines = [f"{method} {target} HTTP/1.1", "Host: run", "Connection: close", framing_header]
    return ("\r\n".join([*lines, "Content-Type: application/json"]) + "\r\n\r\n").encode()


def chunked(body: bytes, piece: int) -> list[bytes]:
    pieces = [body[start : start + piece] for start in range(0, len(body), piece)]
    return [b"%x\r\n%b\r\n" % (len(part), part) for part in pieces] + [b"0\r\n\r\n"]


class Counter:
    def __init__(self) -> None:
        self.sent = 0


async def send_all(sock: socket.socket, parts: list[bytes], counter: Counter) -> None:
    loop = asyncio.get_running_loop()
    for part in parts:
        try:
            await loop.sock_sendall(sock, part)
        except OSError:
            return  # the server hung up: what it did not take is not counted
        counter.sent += len(part)


async def receive_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The first response on the connection; data already sent is readable even after the peer reset."""
    loop = asyncio.get_running_loop()
    buffer = b""
    while True:
        header_end = buffer.find(b"\r\n\r\n")
        if header_end >= 0:
            lines = buffer[:header_end].decode("latin-1").split("\r\n")
            headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
            length = int(headers.get("content-length", "0"))
            if len(buffer) >= header_end + 4 + length:
                return int(lines[0].split()[1]), headers, buffer[header_end + 4 : header_end + 4 + length]
        try:
            data = await loop.sock_recv(sock, 256 * 1024)
        except ConnectionResetError:
            data = b""
        if not data:
            raise AssertionError(f"the connection ended before a whole answer: {buffer[:300]!r}")
        buffer += data


async def exchange(path: Path, request: Request) -> Answer:
    """Send the request, its body framed as asked, while reading the answer."""
    body = request.body
    if request.framing == "length":
        parts = [body[start : start + SEND_PIECE] for start in range(0, len(body), SEND_PIECE)]
    else:
        parts = chunked(body, request.piece)
    return await exchange_raw(path, head(request.method, request.target, request.framing, len(body)), parts)


async def exchange_raw(path: Path, request_head: bytes, parts: list[bytes]) -> Answer:
    """Send the head, then `parts` as they are (the server may hang up part-way) while reading the answer."""
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, str(path))
        await loop.sock_sendall(sock, request_head)
        counter = Counter()
        sender = asyncio.create_task(send_all(sock, parts, counter))
        try:
            status, headers, body = await asyncio.wait_for(receive_answer(sock), EXCHANGE_TIMEOUT)
            # Go on sending after the answer: a server that drains the rest of a refused body shows here.
            await asyncio.wait_for(asyncio.shield(sender), EXCHANGE_TIMEOUT)
        finally:
            sock.shutdown(socket.SHUT_RDWR)  # ends the sender if something above failed
            await sender
    return Answer(status, headers, body, counter.sent)


# --- the server ------------------------------------------------------------------------------------------


class AlwaysLive:
    def is_live(self, run_id: str) -> bool:
        return True


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


@pytest.fixture
async def channel() -> AsyncIterator[tuple[Path, Recorder]]:
    recorder = Recorder()
    with tempfile.TemporaryDirectory(prefix="runapi-") as folder:
        proxy = new_proxy()
        sock = Path(folder) / "run.sock"
        await proxy.open_run(RUN, sock, endpoint=recorder)
        yield sock, recorder
        await proxy.close()


# --- what the server must answer -------------------------------------------------------------------------


def check_answer(request: Request, path: str, refusal: ChannelRefused | None, answer: Answer, got: Recorder) -> None:
    """Every answer is a 200 or a 4xx in the contract's shape, and exactly what the rules say it is."""
    assert 200 <= answer.status < 500 and answer.status not in range(201, 400), answer
    assert answer.headers.get("content-type", "").startswith("application/json")
    if (path, request.method, answer.status) == (TASK_PATH, "GET", 200):
        assert TaskSpec.model_validate_json(answer.body) == SPEC
    else:
        reply = ChannelAnswer.model_validate_json(answer.body)
        assert reply.ok == (answer.status == 200) and len(reply.detail) < 1_000

    expected_status, expected_handed = expected(request, path, refusal)
    assert answer.status == expected_status, (answer, ChannelAnswer.model_validate_json(answer.body).detail)
    assert got.handed() == expected_handed
    for message in got.messages:  # nothing the contract would refuse ever reaches the endpoint
        assert ProgressMessage.model_validate(message.model_dump()) == message
    for result in got.results:
        assert RunResult.model_validate(result.model_dump()) == result
    assert all(len(session) <= MAX_SESSION_BYTES for session in got.sessions)


def expected(request: Request, path: str, refusal: ChannelRefused | None) -> tuple[int, list[object]]:
    """The status and what the endpoint is handed, worked out independently of the server."""
    if path not in ROUTES:
        return 404, []
    if request.method != ROUTES[path]:
        return 405, []
    if path == TASK_PATH:
        return (refusal.status if refusal else 200), []
    if len(request.body) > LIMITS[path]:
        return 413, []
    handed: object = request.body
    if path in MODELS:
        try:
            handed = MODELS[path].model_validate_json(request.body)
        except ValueError:
            return 400, []
    return (refusal.status, []) if refusal else (200, [handed])


# --- hostile requests ------------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


# Not st.integers: Hypothesis leans towards its bounds, so a "one in four" drawn that way comes up far more often.
THREE_IN_FOUR = st.sampled_from([True, True, True, False])


def mostly(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Three times in four `valid`: a body is accepted only when every field is, and acceptance must be tried."""
    return THREE_IN_FOUR.flatmap(lambda pick: valid if pick else hostile)


messages = mostly(
    st.fixed_dictionaries(
        {
            "message_id": mostly(st.from_regex(ID_PATTERN, fullmatch=True), json_values),
            "text": mostly(st.text(min_size=1, max_size=50) | st.text(min_size=3_990, max_size=4_010), json_values),
        },
        optional={"chat_id": json_values},  # not the container's to name
    ),
    st.dictionaries(st.sampled_from(["message_id", "text", "extra"]), json_values),
)
results = st.fixed_dictionaries(
    {"status": mostly(st.sampled_from(["completed", "failed"]), st.just("done") | json_values)},
    optional={
        "result": mostly(st.text(max_size=50), json_values),
        "error": mostly(st.none() | st.text(max_size=50), json_values),
        "input_tokens": mostly(st.integers(min_value=0, max_value=10**6), st.integers(max_value=-1) | json_values),
        "output_tokens": mostly(st.integers(min_value=0, max_value=10**30), st.floats()),
        "run_id": st.just("run-zzzzzz"),  # nor its run
    },
)


def deep(depth: int, kind: str) -> bytes:
    return b"[" * depth + b"]" * depth if kind == "list" else b'{"a":' * depth + b"1" + b"}" * depth


def padded(size: int) -> bytes:
    """A well-formed message of exactly `size` bytes (its text too long once it is large)."""
    frame = b'{"message_id":"abcdef","text":"%b"}'
    return frame % (b"x" * max(0, size - len(frame % b"")))


sizes_near_limits = st.sampled_from([MAX_RUN_BODY_BYTES, MAX_SESSION_BYTES]).flatmap(
    lambda limit: st.integers(min_value=limit - 2, max_value=limit + 2) | st.integers(limit - 70_000, limit + 70_000)
)
bodies = st.one_of(
    st.just(b""),
    st.binary(max_size=2_048),
    json_values.map(lambda value: json.dumps(value).encode()),
    messages.map(lambda value: json.dumps(value).encode()),
    results.map(lambda value: json.dumps(value).encode()),
    st.builds(deep, st.integers(min_value=1, max_value=50_000), st.sampled_from(["list", "object"])),
    sizes_near_limits.map(padded),
    sizes_near_limits.map(lambda size: b"\xff" * size),
)
known_paths = st.sampled_from(sorted(ROUTES))
# (target on the wire, the path the server sees): percent-escapes are decoded, a query is not the path.
odd_targets = st.sampled_from(
    [
        ("/run/", "/run/"),
        ("/run/task/", "/run/task/"),
        ("/run/tasks", "/run/tasks"),
        ("/run//task", "/run//task"),
        ("/run/%74ask", TASK_PATH),
        ("/run/result?run_id=run-zzzzzz", RESULT_PATH),
        ("/run/spawn", "/run/spawn"),
    ]
) | st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.~", min_size=1, max_size=30).map(
    lambda name: (f"/run/x{name}", f"/run/x{name}")
)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND"])
own_bodies = {
    MESSAGE_PATH: messages.map(lambda value: json.dumps(value).encode()),
    RESULT_PATH: results.map(lambda value: json.dumps(value).encode()),
}


@st.composite
def requests(draw: st.DrawFn) -> tuple[Request, str]:
    """A request and the path the server sees. Mostly the API's own paths and methods, with bodies of
    their kind, so that acceptance is exercised as much as refusal."""
    if draw(THREE_IN_FOUR):
        wire = path = draw(known_paths)
    else:
        wire, path = draw(odd_targets)
    method = ROUTES[path] if path in ROUTES and draw(THREE_IN_FOUR) else draw(methods)
    kind = draw(st.sampled_from(["own", "own", "at the limit", "any", "any"]))
    if kind == "own" and path in own_bodies:
        body = draw(own_bodies[path])
    elif kind == "at the limit" and path in LIMITS:
        body = padded(LIMITS[path] + draw(st.integers(min_value=-2, max_value=2) | st.integers(-9_000, 9_000)))
    else:
        body = draw(bodies)
    framing: Framing = draw(st.sampled_from(["length", "chunked"]))
    # A chunk size of 1 for a 4 MiB body is 4 million chunks: a slow test, not a different case.
    piece = max(draw(st.integers(min_value=1, max_value=300_000)), len(body) // 64 + 1)
    return Request(method, wire, body, framing, piece), path


# Mostly none: an endpoint that says yes is how what it is handed gets checked.
refusals = st.sampled_from(
    [None] * 5 + [ChannelRefused(403, "cancelled"), ChannelRefused(409, "reported already"), ChannelRefused(429, "x")]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sent=requests(), refusal=refusals)
def test_any_request_gets_a_4xx_or_200_in_the_contracts_shape(
    sent: tuple[Request, str], refusal: ChannelRefused | None
) -> None:
    request, path = sent
    recorder = Recorder(refusal=refusal)

    answer = asyncio.run(serve(recorder, lambda sock: exchange(sock, request)))

    event(f"{answer.status} {path if path in ROUTES else 'elsewhere'}")  # --hypothesis-show-statistics
    check_answer(request, path, refusal, answer, recorder)


# --- bounds and edges ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "limit", "status"),
    [
        (SESSION_PATH, MAX_SESSION_BYTES, 413),
        (MESSAGE_PATH, MAX_RUN_BODY_BYTES, 413),
        ("/run/nowhere", 0, 404),  # never read at all
        ("/v1/chat/completions", LLM_BODY_LIMIT, 413),  # the proxy's LLM side of the same socket
    ],
)
@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_an_endless_upload_is_cut_off_at_the_limit(
    channel: tuple[Path, Recorder], path: str, limit: int, status: int, framing: Framing
) -> None:
    """The server stops reading at the limit and hangs up: it does not drain the rest (aiohttp's default
    lingers up to 10 s reading whatever the client sends)."""
    sock, recorder = channel
    pieces = (limit + 16 * BUFFER_SLACK) // SEND_PIECE  # far more than the server may take
    if framing == "length":  # the length says 1 GiB: refused before a byte of the body is read
        parts = [b"x" * SEND_PIECE] * pieces
    else:  # no length: the limit shows only as the body passes it, and no terminating chunk ever comes
        parts = [chunked(b"x" * SEND_PIECE, SEND_PIECE)[0]] * pieces

    answer = await exchange_raw(sock, head("POST", path, framing, 1 << 30), parts)

    assert answer.status == status
    assert answer.sent <= limit + BUFFER_SLACK, f"the server read {answer.sent} bytes of a {limit}-byte limit"
    assert recorder.handed() == []


async def test_a_body_at_the_limit_is_taken_whole(channel: tuple[Path, Recorder]) -> None:
    sock, recorder = channel
    session = b"[" + b" " * (MAX_SESSION_BYTES - 2) + b"]"

    answer = await exchange(sock, Request("POST", SESSION_PATH, session, "chunked", piece=100_000))

    assert answer.status == 200 and recorder.sessions == [session]


async def test_a_channel_without_a_run_api_answers_404() -> None:
    answer = await serve(None, lambda sock: exchange(sock, Request("GET", TASK_PATH)))

    assert answer.status == 404
    assert ChannelAnswer.model_validate_json(answer.body) == ChannelAnswer(
        ok=False, detail="this channel serves no run API"
    )


async def test_a_refusal_names_at_most_a_bounded_part_of_the_request(channel: tuple[Path, Recorder]) -> None:
    sock, recorder = channel
    body = json.dumps({"message_id": "abcdef", "text": "hi", "k" * 100_000: 1}).encode()

    answer = await exchange(sock, Request("POST", MESSAGE_PATH, body))

    assert answer.status == 400 and len(ChannelAnswer.model_validate_json(answer.body).detail) < 300
    assert recorder.handed() == []
