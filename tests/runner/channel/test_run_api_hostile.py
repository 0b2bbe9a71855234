"""The run API (`/run/...`) on a real Unix socket against any request (property test): random bytes, deep and
huge JSON, wrong types, bodies near the limits, chunked uploads, unknown paths and methods, refusing
endpoints. Every answer is a 200 or a 4xx in the contract's shape, exactly the one the rules give."""

from __future__ import annotations

import asyncio
import json
from typing import Any

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
from runner.channel.bounded_json import BodyRefused, check_shape
from runner.channel.run_api import ChannelRefused
from tests.runner.channel.run_api_client import Answer, Framing, Request, exchange
from tests.runner.channel.run_api_server import SPEC, Recorder, serve

LIMITS = {MESSAGE_PATH: MAX_RUN_BODY_BYTES, RESULT_PATH: MAX_RUN_BODY_BYTES, SESSION_PATH: MAX_SESSION_BYTES}
MODELS: dict[str, type[BaseModel]] = {MESSAGE_PATH: ProgressMessage, RESULT_PATH: RunResult}
ROUTES = {TASK_PATH: "GET", MESSAGE_PATH: "POST", SESSION_PATH: "POST", RESULT_PATH: "POST"}


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
    if request.framing == "chunked":  # on any path: a run's channel takes a body only with a Content-Length
        return 411, []
    if path not in ROUTES:
        return 404, []
    if request.method != ROUTES[path]:
        return 405, []
    if path == TASK_PATH:
        return (refusal.status if refusal else 200), []
    if len(request.body) > LIMITS[path]:
        return 413, []
    handed: object = request.body
    if path == SESSION_PATH:
        # The scan's own rules are tested in test_bounded_json.py; here: a body it refuses is never handed on.
        try:
            check_shape(request.body, Recorder().limits.max_values)
        except BodyRefused:
            return 400, []
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
