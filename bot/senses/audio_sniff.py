"""What a file said to be audio really is, by its first bytes, and how long it plays when its container says so
cheaply (Ogg and WAV: the voice notes and recordings people post), so a file that is not audio, or audio over
STT_MAX_SECONDS, is refused before it costs a call. Blocking only on the bytes in hand: pure functions."""

from __future__ import annotations

import struct

OPUS_RATE_HZ = 48_000  # Ogg Opus counts granules at 48 kHz whatever it was recorded at
OGG_TAIL_BYTES = 64 * 1024  # the last page, which holds the stream's end position, is well within this
_OGG = b"OggS"
BITS_PER_BYTE = 8
# The lowest bitrate each format is encoded at (bits a second): a file whose length is not read from its container
# plays at most its size over this. Opus goes down to 6 kbit/s, AMR-NB to 4.75, MP3 (MPEG-2.5) to 8.
MIN_BITS_PER_SECOND = {"amr": 4_750, "ogg": 6_000, "webm": 6_000, "m4a": 6_000, "aac": 6_000}
DEFAULT_MIN_BITS_PER_SECOND = 8_000  # mp3, and flac and wav (lossless: far more in practice)
# An Ogg file's length is its last page's word: one that says less than its size could hold at the codec's highest
# bitrate (Opus 510 kbit/s, Vorbis about 500) is not believed (a 25 MB file "of one second").
MAX_OGG_BITS_PER_SECOND = 512_000
MAX_WAV_CHUNKS = 64  # chunks walked to find the data: a real file has a handful


def audio_format(head: bytes) -> str | None:
    """ogg, wav, mp3, m4a, flac, webm, aac or amr by the magic bytes; None: not audio this bot sends on."""
    if head.startswith(_OGG):
        return "ogg"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"ID3") or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE6 == 0xE2):
        return "mp3"  # an ID3 tag, or an MPEG audio frame's sync word (layer III)
    if head[4:8] == b"ftyp":
        return "m4a"  # an MP4 container: m4a, and a video note's mp4
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "webm"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0:
        return "aac"  # ADTS
    if head.startswith(b"#!AMR"):
        return "amr"
    return None


def audio_seconds(data: bytes) -> float | None:
    """How long it plays, from its container (Ogg Opus or Vorbis, WAV); None when that is not known cheaply."""
    kind = audio_format(data[:16])
    if kind == "ogg":
        return _ogg_seconds(data)
    if kind == "wav":
        return _wav_seconds(data)
    return None


def most_seconds(kind: str, size_bytes: int) -> float:
    """The longest a file of this format and size can play: its bits at the format's lowest bitrate."""
    return size_bytes * BITS_PER_BYTE / MIN_BITS_PER_SECOND.get(kind, DEFAULT_MIN_BITS_PER_SECOND)


def _ogg_seconds(data: bytes) -> float | None:
    rate: int | None = None
    head = data[:4096]
    if b"OpusHead" in head:
        rate = OPUS_RATE_HZ
    else:
        at = head.find(b"\x01vorbis")
        if at >= 0 and len(head) >= at + 16:
            rate = struct.unpack_from("<I", head, at + 12)[0]
    if not rate:
        return None
    tail = data[-OGG_TAIL_BYTES:]
    last = tail.rfind(_OGG)
    if last < 0 or len(tail) < last + 14:
        return None
    granule = struct.unpack_from("<q", tail, last + 6)[0]
    if granule <= 0:
        return None
    seconds = granule / rate
    return seconds if len(data) * BITS_PER_BYTE <= seconds * MAX_OGG_BITS_PER_SECOND else None


def _wav_seconds(data: bytes) -> float | None:
    at = 12
    byte_rate: int | None = None
    for _ in range(MAX_WAV_CHUNKS):
        if at + 8 > len(data):
            break
        chunk, size = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt " and at + 20 <= len(data):
            byte_rate = struct.unpack_from("<I", data, at + 16)[0]
        elif chunk == b"data":
            size = min(size, len(data) - at - 8)
            return size / byte_rate if byte_rate else None
        at += 8 + size + (size & 1)
    return None
