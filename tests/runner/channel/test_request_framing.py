"""A request on a run's socket framed as our clients never frame one (a Content-Encoding, a chunked body) is
refused from its head, whatever its path (the run API or the LLM's), reads no body and counts against the
run; three stop it. Over the real socket, with the real inbox."""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from container.protocol import MESSAGE_PATH, MODEL_PATH, RESULT_PATH, SESSION_PATH, TASK_PATH
from runner.channel.run_endpoint import MAX_INVALID_REQUESTS
from runner.runs.live_runs import StopReason
from tests.runner.channel.file_desk_rig import DeskRig, desk_rig
from tests.runner.channel.run_api_client import Answer, chunked, exchange_raw

LLM_PATH = "/v1/chat/completions"
PATHS = [MESSAGE_PATH, RESULT_PATH, SESSION_PATH, MODEL_PATH, "/run/files", LLM_PATH, "/run/nowhere"]
MESSAGE = json.dumps({"message_id": "msg-001", "text": "hello"}).encode()
BIG_BODY_BYTES = 4 * 1024 * 1024
CHUNKED_BODY_BYTES = 512 * 1024
SOCKET_BUFFERS_BYTES = 1024 * 1024  # what a refused body's sender gets into the socket before the hang-up


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DeskRig]:
    async with desk_rig(tmp_path, monkeypatch) as made:
        yield made


async def send(rig: DeskRig, method: str, path: str, headers: list[str], parts: list[bytes]) -> Answer:
    lines = [f"{method} {path} HTTP/1.1", "Host: run", "Connection: close", *headers]
    return await exchange_raw(rig.socket, ("\r\n".join(lines) + "\r\n\r\n").encode(), parts)


def reason(answer: Answer) -> str:
    body = json.loads(answer.body)
    return str(body["detail"] if "detail" in body else body["error"]["message"])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("encoding", ["deflate", "gzip", "identity", "br"])
async def test_a_body_with_a_content_encoding_is_refused_unread_and_counted(
    rig: DeskRig, path: str, encoding: str
) -> None:
    body = zlib.compress(b"\n" * BIG_BODY_BYTES, 9)

    answer = await send(rig, "POST", path, [f"Content-Encoding: {encoding}", f"Content-Length: {len(body)}"], [body])

    assert (answer.status, rig.invalid_count) == (415, 1)
    assert "no Content-Encoding" in reason(answer)


@pytest.mark.parametrize("path", PATHS)
async def test_a_chunked_body_is_refused_from_its_head_and_counted(rig: DeskRig, path: str) -> None:
    # 1-byte chunks: the loop's cost per chunk (the review: 0.31 s for 500 KB) is never paid. 6 bytes of framing
    # a byte: far more than the socket's buffers hold.
    parts = chunked(b"x" * CHUNKED_BODY_BYTES, 1)

    answer = await send(rig, "POST", path, ["Transfer-Encoding: chunked"], parts)

    assert (answer.status, rig.invalid_count) == (411, 1)
    assert "Content-Length" in reason(answer)
    assert answer.sent <= SOCKET_BUFFERS_BYTES


async def test_a_get_with_a_chunked_body_is_refused_too(rig: DeskRig) -> None:
    answer = await send(rig, "GET", TASK_PATH, ["Transfer-Encoding: chunked"], [b"0\r\n\r\n"])

    assert (answer.status, rig.invalid_count) == (411, 1)


async def test_three_misframed_requests_stop_the_run(rig: DeskRig) -> None:
    for sent in range(MAX_INVALID_REQUESTS):
        assert rig.live.stop_reason is None
        answer = await send(rig, "POST", MESSAGE_PATH, ["Transfer-Encoding: chunked"], chunked(MESSAGE, 1))
        assert (answer.status, rig.invalid_count) == (411, sent + 1)
    assert rig.live.stop_reason is StopReason.INVALID_REQUESTS


async def test_a_body_framed_as_ours_still_passes(rig: DeskRig) -> None:
    answer = await send(
        rig, "POST", MESSAGE_PATH, ["Content-Type: application/json", f"Content-Length: {len(MESSAGE)}"], [MESSAGE]
    )

    assert (answer.status, reason(answer), rig.invalid_count) == (200, "sent", 0)


MALFORMED_HEADS = {
    "doubled-length": ["Content-Length: 5", "Content-Length: 6"],
    "length-and-chunks": ["Content-Length: 5", "Transfer-Encoding: chunked"],
    "folded": ["Content-Length: 5", "X-A: a", " folded"],
    "listed-length": ["Content-Length: 5, 5"],
}


@pytest.mark.parametrize("headers", MALFORMED_HEADS.values(), ids=MALFORMED_HEADS.keys())
async def test_a_head_the_parser_refuses_counts_and_logs_no_traceback(
    rig: DeskRig, headers: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    # The review: aiohttp answers these 400 before any handler runs, and logged each with a traceback,
    # counted for nothing (1,000 of them: 512 KB of log).
    answer = await send(rig, "POST", MESSAGE_PATH, headers, [b"hello"])

    assert (answer.status, rig.invalid_count) == (400, 1)
    assert [record for record in caplog.records if record.name == "aiohttp.server"] == []
