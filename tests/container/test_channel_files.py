"""The run channel's file requests: a download streamed into an open file and bounded by the offered size, an
upload streamed from one as the contract's multipart body, and the host's refusals as ChannelRefused."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from container.channel import ChannelRefused, RunChannel
from container.channel_files import FETCH_SLACK_BYTES
from container.protocol import CHANNEL_SOCKET_FILE, FILES_PATH, TaskSpec
from tests.container.fake_files import FakeFiles
from tests.container.scripted_llm import ScriptedLLM

BIG_UPLOAD_BYTES = 8 * 1024 * 1024  # far over what a socket buffers: the host's early answer cuts the upload off

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / CHANNEL_SOCKET_FILE


@pytest.fixture
def out_fd(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path / "download", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    yield fd
    os.close(fd)


async def serving(socket_path: Path, offered: dict[int, bytes], **task: object) -> ScriptedLLM:
    spec = TaskSpec(run_id="run-chfile", task="t", label="l", **task)  # type: ignore[arg-type]
    return ScriptedLLM(socket_path, [], task=spec, files=FakeFiles(offered=offered))


def written(fd: int) -> bytes:
    return os.pread(fd, 1 << 20, 0)


async def test_a_download_is_written_into_the_open_file_from_its_start(socket_path: Path, out_fd: int) -> None:
    data = os.urandom(300_000)
    os.write(out_fd, b"an earlier attempt's longer bytes" * 10_000)

    async with await serving(socket_path, {0: data}), RunChannel(socket_path) as channel:
        count = await channel.fetch_file(0, out_fd, len(data))

    assert count == len(data) and written(out_fd) == data


async def test_the_hosts_refusal_is_its_reason(socket_path: Path, out_fd: int) -> None:
    async with await serving(socket_path, {}), RunChannel(socket_path) as channel:
        with pytest.raises(ChannelRefused, match=r"^no offered file 3$"):
            await channel.fetch_file(3, out_fd, 10)


async def test_a_download_longer_than_offered_is_refused_past_the_slack(socket_path: Path, out_fd: int) -> None:
    async with await serving(socket_path, {0: b"x" * (10 + FETCH_SLACK_BYTES + 1)}), RunChannel(socket_path) as ch:
        with pytest.raises(ChannelRefused, match="more than the"):
            await ch.fetch_file(0, out_fd, 10)


async def test_a_download_shorter_than_offered_is_refused(socket_path: Path, out_fd: int) -> None:
    async with await serving(socket_path, {0: b"x" * 50}), RunChannel(socket_path) as channel:
        with pytest.raises(ChannelRefused, match="ended after 50 of the 100 bytes offered"):
            await channel.fetch_file(0, out_fd, 100)


@pytest.fixture
async def raw_host(socket_path: Path) -> AsyncIterator[Callable[[Handler], Awaitable[None]]]:
    """A host that answers with raw bytes, for answers aiohttp would not give (a body cut short)."""
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> None:
        servers.append(await asyncio.start_unix_server(handler, path=str(socket_path)))

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def read_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def test_a_body_cut_short_of_its_length_is_refused(
    raw_host: Callable[[Handler], Awaitable[None]], socket_path: Path, out_fd: int
) -> None:
    async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n" + b"x" * 10)
        await writer.drain()
        writer.close()

    await raw_host(cut_short)
    async with RunChannel(socket_path) as channel:
        with pytest.raises(ChannelRefused, match="ended after 10 of 1000 bytes"):
            await channel.fetch_file(0, out_fd, 10)


async def test_a_body_of_no_declared_length_is_cut_off_past_the_offered_size(
    raw_host: Callable[[Handler], Awaitable[None]], socket_path: Path, out_fd: int
) -> None:
    sent: list[int] = []

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")  # the body ends when the host closes
        try:
            while len(sent) < 10_000:  # 640 MB, if nobody stopped reading
                writer.write(b"x" * 65_536)
                await writer.drain()
                sent.append(1)
        except ConnectionError:
            pass
        writer.close()

    await raw_host(endless)
    async with RunChannel(socket_path) as channel:
        with pytest.raises(ChannelRefused, match=f"more than the {10 + FETCH_SLACK_BYTES} bytes expected"):
            await channel.fetch_file(0, out_fd, 10)

    assert os.fstat(out_fd).st_size <= 10 + FETCH_SLACK_BYTES


async def test_an_upload_is_the_contracts_two_parts_with_its_length_declared(
    raw_host: Callable[[Handler], Awaitable[None]], socket_path: Path, tmp_path: Path
) -> None:
    requests: list[tuple[bytes, bytes]] = []

    async def take(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await read_head(reader)
        length = int(re.search(rb"\r\nContent-Length: (\d+)\r\n", head)[1])  # type: ignore[index]
        requests.append((head, await reader.readexactly(length)))
        body = b'{"ok": true, "detail": "sent"}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    await raw_host(take)
    data = os.urandom(600_000)
    (tmp_path / "chart.png").write_bytes(data)
    fd = os.open(tmp_path / "chart.png", os.O_RDONLY)
    try:
        async with RunChannel(socket_path) as channel:
            assert await channel.send_file("upload-0001", 'chart "ü".png', "Sales", fd, len(data)) == "sent"
    finally:
        os.close(fd)

    ((head, body),) = requests
    boundary = re.search(rb"Content-Type: multipart/form-data; boundary=(crewbot-[0-9a-f]+)\r\n", head)
    assert boundary is not None
    dashes = b"--" + boundary[1]
    meta = json.dumps({"upload_id": "upload-0001", "name": 'chart "ü".png', "caption": "Sales"}).encode()
    assert body == (
        dashes
        + b'\r\nContent-Disposition: form-data; name="meta"\r\nContent-Type: application/json\r\n\r\n'
        + meta
        + b"\r\n"
        + dashes
        + b'\r\nContent-Disposition: form-data; name="file"; '
        + b"filename=\"chart ___.png\"; filename*=UTF-8''chart%20_%C3%BC_.png\r\n"
        + b"Content-Type: application/octet-stream\r\n\r\n"
        + data
        + b"\r\n"
        + dashes
        + b"--\r\n"
    )


async def test_an_upload_the_host_refuses_before_reading_it_gets_the_hosts_reason(
    raw_host: Callable[[Handler], Awaitable[None]], socket_path: Path, tmp_path: Path
) -> None:
    heads: list[bytes] = []

    async def refuse_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await read_head(reader))
        body = b'{"ok": false, "detail": "the upload is over the limit"}'
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n")
        writer.write(b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    await raw_host(refuse_at_once)
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * BIG_UPLOAD_BYTES)
    fd = os.open(big, os.O_RDONLY)
    try:
        async with RunChannel(socket_path) as channel:
            with pytest.raises(ChannelRefused, match=r"^the upload is over the limit$"):
                await channel.send_file("upload-0001", "big.bin", None, fd, BIG_UPLOAD_BYTES)
    finally:
        os.close(fd)

    assert len(heads) == 1  # a refusal is not tried again
    assert heads[0].startswith(f"POST {FILES_PATH} HTTP/1.1\r\n".encode())
    assert b"Content-Type: multipart/form-data; boundary=crewbot-" in heads[0]


async def test_a_file_that_shrinks_while_it_is_sent_fails_as_a_local_error(socket_path: Path, tmp_path: Path) -> None:
    source = tmp_path / "shrinking.bin"
    source.write_bytes(b"x" * 10)
    fd = os.open(source, os.O_RDONLY)
    try:
        async with await serving(socket_path, {}), RunChannel(socket_path) as channel:
            with pytest.raises(OSError, match="shrank to 10 bytes"):
                await channel.send_file("upload-0001", "shrinking.bin", None, fd, 20)
    finally:
        os.close(fd)
