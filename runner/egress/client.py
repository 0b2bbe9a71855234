"""The container's connection to its door: a stream while the door reads its request head or answers a refusal,
then, once a tunnel carries it, the bare socket (the tunnel's threads splice it) with what the stream had read."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from typing import cast

from runner.egress.refusal import Refused, answer
from runner.egress.request_head import MAX_HEAD_BYTES

LINGER_SECONDS = 2.0  # to hand a refusal over and drop what the client still sends (within MAX_OPENING)
LINGER_BYTES = 256 * 1024


async def client_streams(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An accepted connection as streams; the reader's limit is the head's (a longer head is refused)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=sock)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def detached(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[socket.socket, bytes]:
    """The client's socket, taken from its stream for a tunnel, and what the stream read past the head (a client
    may send before it is answered). The stream is closed; the socket is the caller's (non-blocking). OSError when
    the connection has ended already, or no descriptor is left for it."""
    transport = cast(asyncio.Transport, writer.transport)
    if transport.is_closing():  # the client reset (or broke) the connection while the door connected upstream
        raise ConnectionResetError(errno.ECONNRESET, "the client's connection ended before its tunnel opened")
    transport.pause_reading()
    reader.feed_eof()  # nothing more comes in through the stream: what it holds is read without waiting
    sent_early = await reader.read()
    sock = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
    transport.abort()  # closes its own descriptor; the duplicate keeps the connection
    return sock, sent_early


async def answer_refusal(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refused: Refused) -> None:
    """The refusal, as an HTTP answer, to a client that may already be gone. What the client still sends is
    read and dropped for a moment: closing with unread bytes resets the connection, and a reset passed on by
    the forwarder over TCP can take the answer with it."""
    with contextlib.suppress(ConnectionError, OSError, TimeoutError):
        writer.write(answer(refused.status, refused.reason))
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_SECONDS):
            await writer.drain()
            dropped = 0
            while dropped < LINGER_BYTES and (chunk := await reader.read(LINGER_BYTES)):
                dropped += len(chunk)
