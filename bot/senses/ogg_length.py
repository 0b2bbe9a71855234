"""How long an Ogg Opus or Ogg Vorbis file plays, by its packets, not by the granule position its last page claims
(a sender writes that number: 40 s claimed over 2-byte Opus packets that play 21 hours). The pages are walked as
a demuxer walks them (checksums checked, garbage between pages skipped) and each audio packet's duration added:
Opus by its TOC byte (RFC 6716 §3.1), Vorbis at its longest block's half (the most one packet can add). Pure and
CPU-bound: run it in a thread. The walk is bounded by the file's size (the caller caps it) and stops once the
length passed `enough`, so a file far over the limit costs no more than one at the limit."""

from __future__ import annotations

import itertools
import math
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

OPUS_RATE_HZ = 48_000  # Ogg Opus counts its samples at 48 kHz whatever it was recorded at
PAGE_HEADER_BYTES = 27
CRC_AT = 22  # the checksum field in a page header
MAX_LACING = 255  # a lacing value below this ends a packet
_CAPTURE = b"OggS"
_CONTINUED, _FIRST_PAGE = 0x01, 0x02  # page header flags
# Opus frame sizes in 48 kHz samples by TOC config (bits 7..3): SILK 10/20/40/60 ms, hybrid 10/20, CELT 2.5-20 ms.
_OPUS_FRAME_SAMPLES = (480, 960, 1920, 2880) * 3 + (480, 960) * 2 + (120, 240, 480, 960) * 4
_OPUS_FRAMES = (1, 2, 2, 0)  # by the TOC's code; code 3 says its count in the next byte
OPUS_MAX_PACKET_SAMPLES = 5_760  # 120 ms: the most a valid packet plays (counted for one that is not valid)
OPUS_HEADER_PACKETS, VORBIS_HEADER_PACKETS = 2, 3
_OPUS_HEAD, _VORBIS_HEAD = b"OpusHead", b"\x01vorbis"
VORBIS_RATE_AT, VORBIS_BLOCKSIZES_AT = 12, 28  # in the identification header: the rate, log2 of the block sizes
# A voice note has a page a second or so (a 4-hour one about 15,000); past this many the file is refused rather
# than walked (27-byte empty pages would otherwise cost a checksum each, a million of them in 25 MB).
MAX_OGG_PAGES = 100_000
# Bytes a second of Ogg audio can take at most (Opus 510 kbit/s, Vorbis about 500) and what its headers may add:
# a file of more is mostly something else (bytes a decoder skips, or another codec's) and is not sent.
MAX_OGG_BYTES_PER_SECOND = 64_000
OGG_HEADERS_BYTES = 64 * 1024
# Packets walked at most: 4 hours of 20 ms Opus is 720,000 (a voice note's 60 ms ones, a third of that).
MAX_OGG_PACKETS = 1_000_000
# Ogg's checksum: CRC-32, polynomial 0x04C11DB7, not reflected, no initial or final xor. zlib's is the reflected
# one: fed bit-reversed bytes and its result reversed, it gives Ogg's at C speed.
_REVERSED_BYTES = bytes(int(f"{n:08b}"[::-1], 2) for n in range(256))
_ZLIB_XOR = 0xFFFFFFFF


class LengthRefused(ValueError):
    """The file's length cannot be computed from its bytes (another codec, several streams, a format whose length
    a sender can fake): it is not sent. The message says why, for the chat's history."""


@dataclass(frozen=True, slots=True)
class OggLength:
    seconds: float  # the larger of the packets' sum and the last page's claim
    complete: bool  # False: the walk stopped at `enough`, and the file plays at least this long


def ogg_crc(header: bytes | bytearray, body: bytes = b"") -> int:
    """A page's checksum (its checksum field zeroed in `header`)."""
    raw = zlib.crc32(body.translate(_REVERSED_BYTES), zlib.crc32(header.translate(_REVERSED_BYTES), _ZLIB_XOR))
    return int(f"{raw ^ _ZLIB_XOR:032b}"[::-1], 2)


def ogg_length(data: bytes, enough: float = math.inf) -> OggLength:
    """The file's length by its packets; LengthRefused when it is not one stream of Opus or Vorbis."""
    pages = _pages(data, _Stream())
    first = next(pages, None)
    if first is None:
        raise LengthRefused("it is not a readable Ogg file (no page with a valid checksum)")
    stream, head = first[3], _first_packet(first)
    counter: _Counter
    if head.startswith(_OPUS_HEAD):
        rate, counter = OPUS_RATE_HZ, _OpusCounter(OPUS_HEADER_PACKETS)
    elif head.startswith(_VORBIS_HEAD) and len(head) > VORBIS_BLOCKSIZES_AT:
        rate = struct.unpack_from("<I", head, VORBIS_RATE_AT)[0]
        longest = (1 << (head[VORBIS_BLOCKSIZES_AT] >> 4)) // 2  # a long block adds half its size, at most
        counter = _Counter(VORBIS_HEADER_PACKETS, longest)
    else:
        raise LengthRefused("it is Ogg, but not Opus or Vorbis audio, whose length this bot can compute")
    if rate <= 0:
        raise LengthRefused("its Ogg stream declares no sample rate")
    stop_at = enough * rate
    for flags, lacing, body, _ in itertools.chain((first,), pages):
        counter.page(flags, lacing, body)
        if counter.samples > stop_at:
            return OggLength(counter.samples / rate, complete=False)
    seconds = max(counter.samples, stream.last_granule) / rate
    if len(data) > seconds * MAX_OGG_BYTES_PER_SECOND + OGG_HEADERS_BYTES:
        raise LengthRefused(f"it holds more bytes than {seconds:.0f} s of Ogg audio can (not Ogg pages of audio)")
    return OggLength(seconds, complete=True)


class _Counter:
    """Adds each audio packet's samples as its first segment is met (a packet spanning pages counts once)."""

    def __init__(self, header_packets: int, each: int = 0) -> None:
        self.samples = 0
        self.packets = 0
        self._skip = header_packets
        self._each = each

    def page(self, flags: int, lacing: bytes, body: bytes) -> None:
        # A continued page's first segments end a packet begun before (or, with none pending, are dropped).
        fresh, found = not flags & _CONTINUED, 0
        for size in lacing:
            found += fresh
            fresh = size < MAX_LACING
        self.samples += (found - self._count(found)) * self._each

    def _count(self, found: int) -> int:
        """How many of `found` packets are audio (the stream's first are its headers)."""
        self.packets += found
        if self.packets > MAX_OGG_PACKETS:
            raise LengthRefused(f"it has more than {MAX_OGG_PACKETS:,} Ogg packets, more than any voice recording")
        skipped = min(self._skip, found)
        self._skip -= skipped
        return skipped


class _OpusCounter(_Counter):
    def page(self, flags: int, lacing: bytes, body: bytes) -> None:
        """Each packet's duration by its TOC byte: config → frame size, code 0/1/2/3 → frames (code 3: its count
        byte, within the first segment, which holds 255 bytes unless it is the whole packet). A packet no decoder
        takes (empty, no count, over 120 ms) is counted as the longest one."""
        fresh, at, found, samples = not flags & _CONTINUED, 0, 0, 0
        skip = self._skip
        for size in lacing:
            if fresh:
                found += 1
                if found > skip:
                    if not size:
                        samples += OPUS_MAX_PACKET_SAMPLES
                    else:
                        toc = body[at]
                        frames = _OPUS_FRAMES[toc & 0x03] or ((body[at + 1] & 0x3F) if size >= 2 else 0)
                        frame = _OPUS_FRAME_SAMPLES[toc >> 3]
                        samples += min(frames * frame, OPUS_MAX_PACKET_SAMPLES) if frames else OPUS_MAX_PACKET_SAMPLES
            at += size
            fresh = size < MAX_LACING
        self._count(found)
        self.samples += samples


class _Stream:
    """What the walk learns of the stream on the way: its serial number and the largest granule claimed."""

    def __init__(self) -> None:
        self.serial: int | None = None
        self.last_granule = 0
        self.pages = 0


def _first_packet(page: tuple[int, bytes, bytes, _Stream]) -> bytes:
    _flags, lacing, body, _ = page
    size = 0
    for value in lacing:
        size += value
        if value < MAX_LACING:
            break
    return body[:size]


def _pages(data: bytes, stream: _Stream) -> Iterator[tuple[int, bytes, bytes, _Stream]]:
    """Ogg pages as libogg finds them: a capture pattern, version 0, inside the file, a checksum that matches
    (else the search goes on a byte further, as a demuxer resyncs past garbage)."""
    at = 0
    while (at := data.find(_CAPTURE, at)) >= 0:
        found = _page_at(data, at, stream)
        if found is None:
            at += 1
            continue
        flags, end, lacing, body = found
        at = end
        stream.pages += 1
        if stream.pages > MAX_OGG_PAGES:
            raise LengthRefused(f"it has more than {MAX_OGG_PAGES:,} Ogg pages, more than any voice recording")
        yield flags, lacing, body, stream


def _page_at(data: bytes, at: int, stream: _Stream) -> tuple[int, int, bytes, bytes] | None:
    """(flags, end, lacing values, body) of a valid page at `at`; None when none starts there."""
    if at + PAGE_HEADER_BYTES > len(data) or data[at + 4] != 0:
        return None
    flags, granule, serial, _sequence, crc, count = struct.unpack_from("<BqIIIB", data, at + 5)
    lacing_end = at + PAGE_HEADER_BYTES + count
    lacing = data[at + PAGE_HEADER_BYTES : lacing_end]
    end = lacing_end + sum(lacing)
    if lacing_end > len(data) or end > len(data):
        return None
    header = bytearray(data[at:lacing_end])
    header[CRC_AT : CRC_AT + 4] = bytes(4)
    body = data[lacing_end:end]
    if ogg_crc(header, body) != crc:
        return None
    if stream.serial is None:
        stream.serial = serial
    elif serial != stream.serial:
        raise LengthRefused("it holds more than one Ogg stream, whose length this bot does not compute")
    stream.last_granule = max(stream.last_granule, granule)
    return flags, end, lacing, body
