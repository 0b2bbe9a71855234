"""MP4s for the senses' tests, built box by box as ISO 14496-12 and -14 lay them out: a Telegram video note (an
H.264 track and an AAC one), an .m4a (AAC alone), and the lies a sender can write in them (a header's duration
over a table of 100,000 frames, box sizes out of bounds). The AAC frames are not real AAC, which only the service
would notice: the length is measured from the tables."""

from __future__ import annotations

import struct

AAC_LC = 2  # the AudioSpecificConfig object type of AAC LC, what phones record
AAC_RATE_INDEX = {96_000: 0, 48_000: 3, 44_100: 4, 32_000: 5, 16_000: 8, 8_000: 11}
FRAME_BYTES = 6  # each fake AAC frame's size in the mdat


def box(kind: bytes, *parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I4s", 8 + len(body), kind) + body


def full_box(kind: bytes, *parts: bytes, version: int = 0) -> bytes:
    return box(kind, bytes([version, 0, 0, 0]), *parts)


def esds(rate: int = 44_100, object_type: int = 0x40, asc: bytes | None = None) -> bytes:
    """An elementary stream descriptor: ES, decoder configuration, AudioSpecificConfig (AAC LC, mono)."""
    if asc is None:
        asc = ((AAC_LC << 11) | (AAC_RATE_INDEX[rate] << 7) | (1 << 3)).to_bytes(2, "big")
    specific = bytes([0x05, len(asc)]) + asc
    config = bytes([0x04, 13 + len(specific), object_type, 0x15]) + bytes(3) + struct.pack(">II", 64_000, 64_000)
    es = struct.pack(">HB", 1, 0) + config + specific + bytes([0x06, 0x01, 0x02])  # ES id, flags; SL config
    return full_box(b"esds", bytes([0x03, len(es)]) + es)


def mp4a(rate: int = 44_100, decoder: bytes | None = None, kind: bytes = b"mp4a") -> bytes:
    """An audio sample entry: reserved, data reference 1, version 0, mono 16-bit at `rate` (16.16), its esds."""
    fields = bytes(6) + struct.pack(">H", 1) + bytes(8) + struct.pack(">HHHHI", 1, 16, 0, 0, rate << 16)
    return box(kind, fields, esds(rate) if decoder is None else decoder)


def track(
    handler: bytes, timescale: int, duration: int, entry: bytes, samples: int, ticks: tuple[int, int], offset: int
) -> bytes:
    """A trak of `samples` samples of FRAME_BYTES in one chunk at `offset`; stts of one entry (count, delta)."""
    mdhd = full_box(b"mdhd", struct.pack(">IIIIHH", 0, 0, timescale, duration, 0x55C4, 0))
    hdlr = full_box(b"hdlr", struct.pack(">I4s", 0, handler), bytes(12), b"track\x00")
    stbl = box(
        b"stbl",
        full_box(b"stsd", struct.pack(">I", 1), entry),
        full_box(b"stts", struct.pack(">III", 1, *ticks)),
        full_box(b"stsc", struct.pack(">IIII", 1, 1, samples, 1)),
        full_box(b"stsz", struct.pack(">II", FRAME_BYTES, samples)),
        full_box(b"stco", struct.pack(">II", 1, offset)),
    )
    header = full_box(b"smhd", bytes(4)) if handler == b"soun" else full_box(b"vmhd", bytes(8), version=0)
    dinf = box(b"dinf", full_box(b"dref", struct.pack(">I", 1), full_box(b"url ", version=0)))
    tkhd = full_box(b"tkhd", bytes(80))
    return box(b"trak", tkhd, box(b"mdia", mdhd, hdlr, box(b"minf", header, dinf, stbl)))


def video_track(seconds: float, offset: int) -> bytes:
    """An H.264 track of 30 frames a second (its avc1 entry's fields only: the length is not taken from it)."""
    frames = round(seconds * 30)
    avc1 = box(b"avc1", bytes(6), struct.pack(">H", 1), bytes(16), struct.pack(">HH", 384, 384), bytes(50))
    return track(b"vide", 90_000, frames * 3_000, avc1, frames, (frames, 3_000), offset)


def mp4_audio(
    frames: int,
    rate: int = 44_100,
    *,
    declared_ticks: int | None = None,
    video: bool = True,
    entry: bytes | None = None,
    more_tracks: tuple[bytes, ...] = (),
    moov_extra: bytes = b"",
) -> bytes:
    """ftyp, moov (mvhd, a video track when `video`, the AAC track), mdat: a video note (or, without video, an
    .m4a) of `frames` AAC frames at `rate`. `declared_ticks` is what mdhd and stts say (a lie when given)."""
    ticks = frames * 1_024 if declared_ticks is None else declared_ticks
    seconds = frames * 1_024 / rate
    ftyp = box(b"ftyp", b"isom", struct.pack(">I", 512), b"isomiso2avc1mp41")
    mvhd = full_box(b"mvhd", struct.pack(">IIII", 0, 0, 1_000, round(seconds * 1_000)), bytes(80))

    # stts says what mdhd says: frames of 1,024 ticks, or (the lie) one sample of all the declared ticks.
    stts = (frames, 1_024) if declared_ticks is None else (1, ticks)

    def moov(offset: int) -> bytes:
        sound = track(b"soun", rate, ticks, entry or mp4a(rate), frames, stts, offset)
        pictures = (video_track(seconds, offset + frames * FRAME_BYTES),) if video else ()
        return box(b"moov", mvhd, *pictures, sound, *more_tracks, moov_extra)

    first = len(ftyp) + len(moov(0)) + 8  # the mdat's payload: the audio's chunk, then the video's
    pictures = round(seconds * 30) * FRAME_BYTES if video else 0
    return ftyp + moov(first) + box(b"mdat", bytes(frames * FRAME_BYTES + pictures))
