"""Whether a file a subagent sends is a photo Telegram would take (sendPhoto) or a document (sendDocument).

The subagent is hostile and names its files as it likes, so only the bytes decide: a file is a photo only
when its header parses as a PNG, JPEG or WebP whose size and dimensions are within Telegram's photo limits.
Anything else (a text file behind a PNG signature, a truncated header, a GIF, an SVG) goes as a document,
which Telegram takes whatever it holds. Parsing never raises and always ends: every loop moves forward.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from enum import Enum

PHOTO_HEAD_BYTES = 64 * 1024  # a JPEG's frame header may follow EXIF/ICC segments; beyond this, a document
MAX_PHOTO_BYTES = 10 * 1024 * 1024
MAX_SIDES_SUM = 10_000
MAX_SIDE_RATIO = 20


class PhotoFormat(Enum):
    PNG = "png"
    JPEG = "jpeg"
    WEBP = "webp"


@dataclass(frozen=True, slots=True)
class Photo:
    format: PhotoFormat
    width: int
    height: int
    mime_type: str  # image/png, image/jpeg or image/webp


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SOI = b"\xff\xd8"
# Frame headers (SOFn) hold the dimensions; C4 (DHT), C8 (JPG) and CC (DAC) sit in the same range but do not.
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RST0-7 carry no length
_JPEG_NO_FRAME = frozenset({0x00, 0xD8, 0xD9, 0xDA})  # no marker, a second SOI, EOI, SOS: no frame header came


def photo_of(head: bytes, size_bytes: int) -> Photo | None:
    """The photo these bytes are, if Telegram would take them as one; None: send as a document.

    `head` is the file's start (at least PHOTO_HEAD_BYTES of it when the file is that long; more is ignored)
    and `size_bytes` the whole file's size.
    """
    head = head[:PHOTO_HEAD_BYTES]
    # A size smaller than the bytes in hand is a caller's mistake, not a photo.
    if not 0 < len(head) <= size_bytes <= MAX_PHOTO_BYTES:
        return None
    if head.startswith(_PNG_SIGNATURE):
        kind, found = PhotoFormat.PNG, _png_size(head)
    elif head.startswith(_JPEG_SOI):
        kind, found = PhotoFormat.JPEG, _jpeg_size(head)
    elif head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        kind, found = PhotoFormat.WEBP, _webp_size(head)
    else:
        return None
    if found is None:
        return None
    width, height = found
    if width <= 0 or height <= 0 or width + height > MAX_SIDES_SUM:
        return None
    if max(width, height) > MAX_SIDE_RATIO * min(width, height):
        return None
    return Photo(kind, width, height, f"image/{kind.value}")


def _png_size(head: bytes) -> tuple[int, int] | None:
    # The signature, then IHDR first: length 13, type, width and height (big-endian), five more bytes, a CRC.
    # The CRC must hold too, so random bytes behind a real signature do not pass for dimensions.
    ihdr = head[8:33]
    if len(ihdr) < 25 or ihdr[:8] != b"\x00\x00\x00\x0dIHDR":
        return None
    if zlib.crc32(ihdr[4:21]) != int.from_bytes(ihdr[21:25], "big"):
        return None
    return int.from_bytes(ihdr[8:12], "big"), int.from_bytes(ihdr[12:16], "big")


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    # Walk the marker segments after SOI until a frame header; each turn moves at least two bytes on.
    end = len(head)
    i = 2
    while i < end and head[i] == 0xFF:
        while i < end and head[i] == 0xFF:  # fill bytes may pad before any marker
            i += 1
        if i >= end:
            return None
        marker = head[i]
        i += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker in _JPEG_NO_FRAME or i + 2 > end:
            return None
        length = int.from_bytes(head[i : i + 2], "big")  # counts its own two bytes, not the marker
        if length < 2:  # 0 or 1 would point back into the length itself
            return None
        if marker in _JPEG_SOF:
            # Lf, P, Y (height), X (width), Nf, then three bytes per component: Lf = 8 + 3 * Nf.
            frame = head[i : i + length]
            if len(frame) < length or length < 8 or length != 8 + 3 * frame[7]:
                return None
            return int.from_bytes(frame[5:7], "big"), int.from_bytes(frame[3:5], "big")
        i += length
    return None


def _webp_size(head: bytes) -> tuple[int, int] | None:
    # RIFF, its size, WEBP, then the first chunk: its FourCC at 12, its size (little-endian) at 16, data at 20.
    if len(head) < 20:
        return None
    fourcc = head[12:16]
    chunk_size = int.from_bytes(head[16:20], "little")
    data = head[20:30]
    if fourcc == b"VP8 ":
        # Lossy: a 3-byte frame tag (bit 0 clear on a key frame), the start code, then 14-bit width and height
        # (the top two bits of each are a scale, not size).
        if chunk_size < 10 or len(data) < 10 or data[0] & 1 or data[3:6] != b"\x9d\x01\x2a":
            return None
        return int.from_bytes(data[6:8], "little") & 0x3FFF, int.from_bytes(data[8:10], "little") & 0x3FFF
    if fourcc == b"VP8L":
        # Lossless: signature 0x2F, then 32 bits: width - 1 (14), height - 1 (14), alpha (1), version (3) = 0.
        if chunk_size < 5 or len(data) < 5 or data[0] != 0x2F:
            return None
        bits = int.from_bytes(data[1:5], "little")
        if bits >> 29:
            return None
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if fourcc == b"VP8X":
        # Extended: flags, 3 reserved bytes, canvas width - 1 and height - 1 (24 bits each). An animation
        # (flag 0x02) would lose its frames as a photo, so it goes as a document.
        if chunk_size != 10 or len(data) < 10 or data[0] & 0x02:
            return None
        return int.from_bytes(data[4:7], "little") + 1, int.from_bytes(data[7:10], "little") + 1
    return None
