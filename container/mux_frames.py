"""The bridged run channel's frames (container/mux.py carries them): a header `!BII` (type, stream id, payload
length) and at most MAX_FRAME_PAYLOAD_BYTES of payload, read so that a bad header is refused before its payload."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from enum import IntEnum

HEADER = struct.Struct("!BII")
CREDIT = struct.Struct("!I")
MAX_FRAME_PAYLOAD_BYTES = 256 * 1024
MAX_TARGET_BYTES = 32  # an OPEN's payload: a target's name


class FrameType(IntEnum):
    HELLO = 1  # host to pod: a new session; the pod drops every stream of an earlier one
    OPEN = 2  # pod to host: a new stream; payload = the target's name (ascii)
    DATA = 3
    WINDOW = 4  # payload = the credit returned, 4 bytes
    EOF = 5  # the sender writes no more on this stream (a half-close)
    RESET = 6  # the stream is aborted


FRAME_TYPES = frozenset(FrameType)


class MuxError(Exception):
    """The peer broke the protocol; the mux has ended."""


@dataclass(frozen=True, slots=True)
class Frame:
    type: FrameType
    stream_id: int
    payload: bytes = b""


def encode_frame(frame_type: FrameType, stream_id: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_FRAME_PAYLOAD_BYTES:
        raise ValueError(f"a frame's payload is at most {MAX_FRAME_PAYLOAD_BYTES} bytes, not {len(payload)}")
    return HEADER.pack(frame_type, stream_id, len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> Frame | None:
    """The next frame; None when the stream ends (at a frame's boundary or inside one: the transport broke).
    A bad type or an oversize length raises MuxError before any payload is read."""
    try:
        raw_type, stream_id, length = HEADER.unpack(await reader.readexactly(HEADER.size))
        if raw_type not in FRAME_TYPES:
            raise MuxError(f"unknown frame type {raw_type}")
        if length > MAX_FRAME_PAYLOAD_BYTES:
            raise MuxError(f"frame payload of {length} bytes is over {MAX_FRAME_PAYLOAD_BYTES}")
        return Frame(FrameType(raw_type), stream_id, await reader.readexactly(length) if length else b"")
    except asyncio.IncompleteReadError:
        return None
