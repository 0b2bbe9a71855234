"""A raw HTTP/1.1 client for the run API's Unix socket. An HTTP library would refuse to send some hostile
requests, or stop at the server's early answer, and the tests must count what the server really read."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

EXCHANGE_TIMEOUT = 10.0
SEND_PIECE = 64 * 1024


Framing = Literal["length", "chunked"]


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
