"""The run API's bounds and edges on a real Unix socket: endless uploads cut off at the limit (with and
without a length), a body at the limit taken whole, a channel without a run API, bounded refusals."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.protocol import (
    MAX_RUN_BODY_BYTES,
    MAX_SESSION_BYTES,
    MESSAGE_PATH,
    SESSION_PATH,
    TASK_PATH,
    ChannelAnswer,
)
from tests.runner.channel.run_api_client import SEND_PIECE, Framing, Request, chunked, exchange, exchange_raw, head
from tests.runner.channel.run_api_server import LLM_BODY_LIMIT, RUN, Recorder, new_proxy, serve

# What the kernel's socket buffers, asyncio's and aiohttp's read buffers hold beyond what the server has read.
BUFFER_SLACK = 2 * 1024 * 1024


@pytest.fixture
async def channel() -> AsyncIterator[tuple[Path, Recorder]]:
    recorder = Recorder()
    with tempfile.TemporaryDirectory(prefix="runapi-") as folder:
        proxy = new_proxy()
        sock = Path(folder) / "run.sock"
        await proxy.open_run(RUN, sock, endpoint=recorder)
        yield sock, recorder
        await proxy.close()


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
    else:  # no length, and no terminating chunk ever comes
        parts = [chunked(b"x" * SEND_PIECE, SEND_PIECE)[0]] * pieces

    answer = await exchange_raw(sock, head("POST", path, framing, 1 << 30), parts)

    # Chunked: refused from its head (runner/channel/request_framing.py), whatever the path.
    assert answer.status == (status if framing == "length" else 411)
    assert answer.sent <= limit + BUFFER_SLACK, f"the server read {answer.sent} bytes of a {limit}-byte limit"
    assert recorder.handed() == []


async def test_a_body_at_the_limit_is_taken_whole(channel: tuple[Path, Recorder]) -> None:
    sock, recorder = channel
    session = b"[" + b" " * (MAX_SESSION_BYTES - 2) + b"]"

    answer = await exchange(sock, Request("POST", SESSION_PATH, session, "length", piece=100_000))

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
