"""What a file said to be audio really is, by its first bytes, and how long it plays by its own bytes (Ogg by
its packets, WAV by its samples, MP4 by its audio track's sample table: the voice notes, video notes and
recordings people post; MP3 bounded by its size), so a file
that is not audio, audio over STT_MAX_SECONDS, or audio whose length cannot be known is refused before it costs
a call. Never a header's claimed length alone: a sender writes it. Blocking only on the bytes in hand."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from bot.senses.mp4_length import mp4_seconds
from bot.senses.ogg_length import LengthRefused, ogg_length

_OGG = b"OggS"
BITS_PER_BYTE = 8
# The lowest bitrate a format's frames can declare (bits a second), for the formats whose length is bounded by
# their size rather than computed: an MP3 frame's bitrate is in its header, 8 kbit/s at the least (MPEG-2.5).
MIN_BITS_PER_SECOND = {"mp3": 8_000}
MAX_WAV_CHUNKS = 64  # chunks walked to find the data: a real file has a handful
WAV_FMT_BYTES = 16  # a WAV format chunk's fields: code, channels, rate, byte rate, block align, bits
WAV_FMT_MAX_BYTES = 40  # WAVE_FORMAT_EXTENSIBLE's, the longest read
WAV_EXTENSIBLE, WAV_SUBFORMAT_AT = 0xFFFE, 24  # its real format code is the sub-format GUID's first two bytes
WAV_PCM_CODES = frozenset({0x0001, 0x0003, 0x0006, 0x0007})  # integer and float PCM, A-law, µ-law: a byte rate


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


@dataclass(frozen=True, slots=True)
class AudioLength:
    seconds: float
    complete: bool  # False: measuring stopped past `enough`; the file plays at least this long


def measure_audio(data: bytes, enough: float = math.inf) -> AudioLength | None:
    """How long it plays, computed from its own bytes (Ogg Opus or Vorbis by its packets, PCM WAV by its
    samples, MP4's AAC by its sample count, bot/senses/mp4_length.py); None for MP3, which most_seconds bounds by
    its size; LengthRefused for every other format, whose length a sender can fake in a way neither its header
    nor its size betrays (a WebM of tiny laced frames, a FLAC at 1 Hz), and for an MP4 whose audio cannot be
    counted. Stops an Ogg's walk once past `enough` seconds. CPU-bound: run it in a thread."""
    kind = audio_format(data[:16])
    if kind == "ogg":
        found = ogg_length(data, enough)
        return AudioLength(found.seconds, found.complete)
    if kind == "wav":
        return AudioLength(_wav_seconds(data), complete=True)
    if kind == "m4a":  # video notes (H.264 + AAC) and .m4a: its one audio track's samples, the file's size capped
        return AudioLength(mp4_seconds(data), complete=True)
    if kind in MIN_BITS_PER_SECOND:
        return None
    name = kind.upper() if kind else "this"
    raise LengthRefused(f"the length of {name} audio cannot be computed from its bytes (send Ogg, WAV, MP3 or M4A)")


def audio_seconds(data: bytes) -> float | None:
    """measure_audio's seconds, walked to the end."""
    found = measure_audio(data)
    return found.seconds if found is not None else None


def most_seconds(kind: str, size_bytes: int) -> float:
    """The longest an MP3 of this size can play: its bits at the lowest bitrate its frames can declare."""
    return size_bytes * BITS_PER_BYTE / MIN_BITS_PER_SECOND[kind]


def _wav_seconds(data: bytes) -> float:
    """Samples by their size, never the declared byte rate (which no decoder uses for PCM): the bytes to the
    file's end (trailing chunks counted too) over the rate times the smaller of the frame sizes it states."""
    at = 12
    frame_rate: int | None = None
    for _ in range(MAX_WAV_CHUNKS):
        if at + 8 > len(data):
            break
        chunk, size = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt " and frame_rate is None:
            frame_rate = _wav_frame_rate(data[at + 8 : at + 8 + min(size, WAV_FMT_MAX_BYTES)])
        elif chunk == b"data":
            if frame_rate is None:
                raise LengthRefused("its WAV data comes before its format")
            return (len(data) - at - 8) / frame_rate
        at += 8 + size + (size & 1)
    raise LengthRefused("its WAV chunks do not lead to its audio")


def _wav_frame_rate(fmt: bytes) -> int:
    """Bytes a second of PCM (integer, float, A-law, µ-law): the sample rate times a frame's bytes."""
    if len(fmt) < WAV_FMT_BYTES:
        raise LengthRefused("its WAV format is cut short")
    code, channels, rate, _byte_rate, block_align, bits = struct.unpack_from("<HHIIHH", fmt)
    if code == WAV_EXTENSIBLE and len(fmt) >= WAV_SUBFORMAT_AT + 2:
        code = struct.unpack_from("<H", fmt, WAV_SUBFORMAT_AT)[0]
    if code not in WAV_PCM_CODES:
        raise LengthRefused(f"its WAV audio is compressed (format 0x{code:04x}), whose length is not computed")
    frame = min(block_align, channels * -(-bits // BITS_PER_BYTE))  # a lie in either only makes it longer
    if rate <= 0 or frame <= 0:
        raise LengthRefused("its WAV format declares no samples")
    return int(rate * frame)
