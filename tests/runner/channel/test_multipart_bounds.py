"""A run's file upload read within the host's bounds, over the real run socket with the real inbox and desk: the
review's reproductions (a preamble of line feeds, compressed or not; an epilogue; a stream of short lines)
are refused at their first line that breaks a rule, read no further, and count against the run; the
repeats a run can make without breaking a rule (an empty file, an upload id sent again and again) count too."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runner.channel.multipart_bounds import MAX_LINE_BYTES, MAX_UPLOAD_LINES
from runner.channel.run_endpoint import MAX_INVALID_REQUESTS
from runner.runs.live_runs import StopReason
from tests.runner.channel.file_desk_rig import (
    BOUNDARY,
    MAX_FILE_BYTES,
    DeskRig,
    desk_rig,
    file_part,
    meta_part,
    multipart,
    part,
)
from tests.runner.channel.run_api_client import Answer, exchange_raw
from tests.runner.channel.test_file_transfer import check_kept, detail

META = meta_part({"upload_id": "upload-01", "name": "a.txt"})
VALID = multipart(META, file_part(b"the file"))
# The most a refused body's sender gets into the socket before the host hangs up: the kernel's buffers.
SOCKET_BUFFERS_BYTES = 1024 * 1024


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DeskRig]:
    async with desk_rig(tmp_path, monkeypatch) as made:
        yield made


async def post_raw(rig: DeskRig, body: bytes, *extra_headers: str) -> Answer:
    lines = [
        "POST /run/files HTTP/1.1",
        "Host: run",
        "Connection: close",
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}",
        f"Content-Length: {len(body)}",
        *extra_headers,
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return await exchange_raw(rig.socket, head, [body[start : start + 65_536] for start in range(0, len(body), 65_536)])


async def refused_and_counted(rig: DeskRig, answer: Answer, status: int, reason: str) -> None:
    assert (answer.status, rig.invalid_count) == (status, 1), detail(answer)
    assert reason in detail(answer)
    await check_kept(rig, 0)
    assert detail(await rig.upload(b"after", upload_id="upload-02")) == "sent"  # the desk is free again


async def test_the_reviewers_compressed_preamble_is_refused_unread(rig: DeskRig) -> None:
    # 8 MB of line feeds in 8 KB of deflate: aiohttp inflated it on the loop (a 6.2 s stall) before any limit.
    plain = b"\n" * (8 << 20) + VALID
    body = zlib.compress(plain, 9)
    assert len(body) < 10_000

    answer = await post_raw(rig, body, "Content-Encoding: deflate")

    await refused_and_counted(rig, answer, 415, "no Content-Encoding")
    assert answer.sent <= SOCKET_BUFFERS_BYTES


@pytest.mark.parametrize("preamble", [b"\n", b"\r\n", b"x\r\n", b"--not-the-boundary\r\n"])
async def test_a_preamble_is_refused_at_its_first_line(rig: DeskRig, preamble: bytes) -> None:
    # Each line of a preamble was one readline() on the loop: about a second a megabyte of line feeds.
    body = preamble * ((MAX_FILE_BYTES - len(VALID)) // len(preamble)) + VALID

    answer = await post_raw(rig, body)

    await refused_and_counted(rig, answer, 400, "no preamble")


async def test_a_first_line_longer_than_the_boundary_is_not_read_whole(rig: DeskRig) -> None:
    body = b"y" * (MAX_FILE_BYTES - len(VALID)) + b"\r\n" + VALID

    answer = await post_raw(rig, body)

    await refused_and_counted(rig, answer, 400, "no preamble")


@pytest.mark.parametrize("epilogue", [b"\n" * 100_000, b"trailing words\r\n", b"--b0undary\r\n"])
async def test_nothing_may_follow_the_closing_boundary(rig: DeskRig, epilogue: bytes) -> None:
    answer = await post_raw(rig, VALID + epilogue)

    await refused_and_counted(rig, answer, 400, "nothing may follow its closing boundary")


async def test_a_final_line_break_after_the_closing_boundary_is_taken(rig: DeskRig) -> None:
    # What some clients send; ours sends none (container/channel_files.py).
    answer = await post_raw(rig, VALID + b"\r\n")

    assert (answer.status, detail(answer), rig.invalid_count) == (200, "sent", 0)


async def test_part_headers_of_many_short_lines_stop_at_the_line_cap(rig: DeskRig) -> None:
    header_lines = b"".join(b"X-%d: v\r\n" % n for n in range(MAX_UPLOAD_LINES))
    body = f"--{BOUNDARY}\r\n".encode() + header_lines + b"\r\n{}\r\n" + multipart(file_part(b"x"))

    answer = await post_raw(rig, body)

    await refused_and_counted(rig, answer, 400, f"over {MAX_UPLOAD_LINES} lines")


async def test_a_valid_upload_reads_well_within_the_line_cap(rig: DeskRig) -> None:
    # The container's own client's shape (container/channel_files.py): what the cap must always let through.
    answer = await rig.upload(b"x" * (MAX_FILE_BYTES - 1))

    assert (answer.status, detail(answer), rig.invalid_count) == (200, "sent", 0)


async def test_an_empty_file_counts_against_the_run(rig: DeskRig) -> None:
    # The tool refuses an empty file before sending it: a run that sends one again and again is not that tool.
    for sent in range(MAX_INVALID_REQUESTS):
        answer = await rig.upload(b"", upload_id=f"upload-empty-{sent}")
        assert (answer.status, rig.invalid_count) == (422, sent + 1)
    assert rig.live.stop_reason is StopReason.INVALID_REQUESTS


async def test_an_upload_id_is_answered_already_sent_once_then_counted(rig: DeskRig) -> None:
    assert detail(await rig.upload(b"once", upload_id="upload-same")) == "sent"
    retry = await rig.upload(b"once", upload_id="upload-same")
    assert (retry.status, detail(retry), rig.invalid_count) == (200, "already sent", 0)

    for repeat in range(MAX_INVALID_REQUESTS):
        again = await rig.upload(b"once", upload_id="upload-same")
        assert (again.status, rig.invalid_count) == (409, repeat + 1), detail(again)
    assert rig.live.stop_reason is StopReason.INVALID_REQUESTS
    await check_kept(rig, 1)


@pytest.mark.parametrize(
    "header", ["Content-Transfer-Encoding: base64", "Content-Encoding: gzip", "Content-Length: 5", "X-Other: 1"]
)
async def test_a_part_header_our_client_does_not_send_is_refused(rig: DeskRig, header: str) -> None:
    # The review: a base64 part of 20 MB held the loop ten times as long as the same bytes plain (1 s of loop
    # CPU, gaps of 59 ms), and was accepted.
    data = (b"AAAAA" + b"!" * 131_067) * 2
    headers = ['Content-Disposition: form-data; name="file"; filename="x"', header]

    answer = await post_raw(rig, multipart(META, part(headers, data)))

    await refused_and_counted(rig, answer, 400, "only Content-Disposition and Content-Type")


async def test_a_part_header_line_is_read_at_most_its_limit(rig: DeskRig) -> None:
    disposition = 'Content-Disposition: form-data; name="file"; filename="x"' + ";" * MAX_LINE_BYTES
    answer = await post_raw(rig, multipart(META, part([disposition], b"data")))

    await refused_and_counted(rig, answer, 400, f"a line over {MAX_LINE_BYTES} bytes")


async def test_our_clients_longest_name_is_within_the_line_limit(rig: DeskRig) -> None:
    # 255 bytes of UTF-8, sent as filename (ASCII) and filename* (percent-encoded): container/channel_files.py.
    name = "é" * 120 + ".txt"
    answer = await rig.upload(b"data", name=name)

    assert (answer.status, detail(answer), rig.invalid_count) == (200, "sent", 0)


async def test_uploads_past_the_file_limit_count_from_the_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tool stops at the limit itself (container/tools.py): the review sent 500 more, each refused for free.
    async with desk_rig(tmp_path, monkeypatch, max_files=1) as rig:
        assert detail(await rig.upload(b"x", upload_id="upload-01")) == "sent"
        over = await rig.upload(b"x", upload_id="upload-02")
        assert (over.status, rig.invalid_count) == (429, 0)
        for repeat in range(MAX_INVALID_REQUESTS):
            again = await rig.upload(b"x", upload_id=f"upload-{repeat + 3:02d}")
            assert (again.status, rig.invalid_count) == (429, repeat + 1)
        assert rig.live.stop_reason is StopReason.INVALID_REQUESTS


async def test_an_upload_declared_over_the_limit_counts(rig: DeskRig) -> None:
    # The tool measures the file before it sends it: a declared length over the limit is another client's.
    answer = await post_raw_declared(rig, 1 << 30)

    assert (answer.status, rig.invalid_count) == (413, 1)


async def post_raw_declared(rig: DeskRig, length: int) -> Answer:
    lines = [
        "POST /run/files HTTP/1.1",
        "Host: run",
        "Connection: close",
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}",
        f"Content-Length: {length}",
    ]
    return await exchange_raw(rig.socket, ("\r\n".join(lines) + "\r\n\r\n").encode(), [VALID])
