"""Defects a second review found in the host's early first call (runner/first_call.py, runner/llm_prefetch.py),
each kept as a regression test (they failed on 942155b).

Learning a run's first request runs the container's code on the host with the run's prior session, which an
earlier container wrote (the host validates and trims it to SUBAGENT_SESSION_MAX_MESSAGES messages, not parts).
The cost of building a request is per content item, not per byte: the OpenAI SDK walks every item of every
message in Python (openai/_utils/_transform.py) without ever yielding to the event loop, so the learn's
`asyncio.wait(timeout=CAPTURE_TIMEOUT_SECONDS)` never fires while it runs; such a session is now refused up
front. Measured on this machine (openai):
a 120 KB session of 30,000 one-letter items takes about 8 s of host CPU; a 4 MB one (1,000,000 items, which
`runner.sessions.clean` accepts) 190 s and 740 MB of host memory, outside any container limit, for each run of
that chat, in one of the two learn threads that every chat's runs share.

The proxy reads the prefetch header as text and encodes it before comparing: a header that is not UTF-8 (a
container sends whatever bytes it likes) raises UnicodeEncodeError there, an unhandled 500 with a traceback in
the host's log, outside the run's request count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

from runner.first_call import FirstCalls, FirstRequestUnknown, learn_first_request
from runner.llm_prefetch import PREFETCH_HEADER, PrefetchMark
from runner.sessions import clean
from tests.container.agent_helpers import make_task
from tests.fakes.llm_server import FakeLLM
from tests.runner.llm_proxy_helpers import ProxyFactory, fake_openai

PATH = "/v1/chat/completions"
CROWDED_ITEMS = 30_000  # a 120 KB session; about 8 s to build its first request on this machine


def crowded_session(items: int) -> list[Any]:
    """A prior session as the host keeps it (validated and trimmed by runner.sessions.clean) whose one user
    prompt holds `items` one-letter content items: two messages, 4 bytes of JSON an item."""
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content=["a"] * items)]),
        ModelResponse(parts=[TextPart(content="Done.")]),
    ]
    kept: list[Any] = json.loads(clean(ModelMessagesTypeAdapter.dump_json(history), 200))
    return kept


def test_a_crowded_prior_session_is_refused_before_anything_is_built() -> None:
    """No time limit can stop the SDK's walk once it has begun: the host refuses such a session up front
    (the container, within its own limits, builds its first request itself)."""
    task = make_task(model="scripted-model", history=crowded_session(CROWDED_ITEMS))

    with pytest.raises(FirstRequestUnknown, match="items"):
        learn_first_request(task)


@pytest.mark.usefixtures("allow_model_requests")
async def test_a_chat_with_a_crowded_session_gets_no_early_call_and_the_others_still_do() -> None:
    """Its runs learn nothing (said in the log) and hold neither learn thread from another chat's run."""
    first_calls = FirstCalls(PrefetchMark(), lambda: True)
    crowded = crowded_session(CROWDED_ITEMS)
    try:
        with structlog.testing.capture_logs() as logs:
            learning = [
                first_calls.learn_soon(make_task(run_id=f"run-crowded-{i}", model="scripted-model", history=crowded))
                for i in range(2)
            ]
            other_chat = first_calls.learn_soon(make_task(run_id="run-other-chat", model="scripted-model"))
            assert other_chat is not None and all(task is not None for task in learning)
            learned = await other_chat
            crowded_learned = [await task for task in learning if task is not None]
    finally:
        await first_calls.close()

    assert learned is not None
    assert crowded_learned == [None, None]
    refused = [e for e in logs if e["event"] == "first_call_not_learned"]
    assert len(refused) == 2 and all("items" in e["error"] for e in refused)


async def test_a_prefetch_header_that_is_not_utf8_is_not_a_500(
    fake_llm: FakeLLM, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """A container's request with `X-Crewbot-Prefetch: \\xff\\xfe` is not the host's: it is an ordinary call
    (or refused with a 4xx), never an unhandled exception in the proxy."""
    await make_proxy(fake_openai(fake_llm))
    body = json.dumps({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}).encode()
    reader, writer = await asyncio.open_unix_connection(str(tmp_path / "llm.sock"))
    try:
        writer.write(
            f"POST {PATH} HTTP/1.1\r\nHost: llm\r\nContent-Type: application/json\r\n".encode()
            + PREFETCH_HEADER.encode()
            + b": \xff\xfe\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    status = int(status_line.split()[1])
    assert status < 500, status_line
