"""How long an MP4 or M4A's audio plays (a Telegram video note is H.264 + AAC in MP4; an .m4a is AAC), by its
sample table, not by the durations its header declares: a sender writes those, and an mdhd that says 10 s over a
table of 100,000 AAC frames plays 35 minutes at 48 kHz. The boxes are walked by their sizes, bounded (a box
running past its parent or the file, nesting too deep, or too many boxes is refused), and the one audio track's
playing time is the longest of its mdhd duration, its stts total, and its sample count times the most one sample
decodes to (AAC: 1,024 samples at the core rate its decoder configuration says; Opus: 120 ms). Any other codec,
several audio tracks or a fragmented file is refused, its reason said. Pure and CPU-bound: run it in a thread."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bot.senses.ogg_length import LengthRefused

BOX_HEADER_BYTES, LARGE_HEADER_BYTES = 8, 16  # size and type; with a 64-bit size after them
FULL_BOX_BYTES = 4  # a full box's version and flags
# Boxes walked at most, the whole file: a video note or an m4a has a few dozen (a long one's mdat is still one);
# 25 MB of 8-byte free boxes would be three million.
MAX_BOXES = 4_096
# Containers inside containers at most: moov/trak/mdia/minf/stbl/stsd/mp4a/wave/esds is the deepest read.
MAX_DEPTH = 10
STSD_DEPTH, ENTRY_DEPTH, WAVE_DEPTH = 6, 7, 8  # the depths of a sample description's entries, theirs, wave's
CONTAINERS = frozenset({b"moov", b"trak", b"mdia", b"minf", b"stbl", b"mvex", b"edts", b"dinf"})
# stts entries summed at most: a real table has one to a few (a delta that changes); 3 MB of them is refused.
MAX_STTS_ENTRIES = 400_000
AAC_FRAME_SAMPLES = 1_024  # what one AAC access unit decodes to (the 960 variant is shorter: 1,024 bounds both)
AAC_RATES_HZ = (96_000, 88_200, 64_000, 48_000, 44_100, 32_000, 24_000, 22_050, 16_000, 12_000, 11_025, 8_000, 7_350)
AAC_MIN_RATE_HZ = 7_350  # the lowest rate AAC's table has: an explicit lower one is a lie that lengthens frames
AAC_EXPLICIT_RATE = 15  # a sampling frequency index that is followed by the rate itself (24 bits)
# esds object types that are AAC (MPEG-4 audio; MPEG-2 AAC main, LC, SSR). 0x69/0x6B are MP3 in MP4, whose frames
# are 1,152 samples: not counted as AAC's.
AAC_OBJECT_TYPES = frozenset({0x40, 0x66, 0x67, 0x68})
ES_TAG, DECODER_CONFIG_TAG, DECODER_INFO_TAG = 0x03, 0x04, 0x05
OPUS_MAX_PACKET_SECONDS = 0.120  # the most one Opus packet plays (RFC 6716 §3.2.5), whatever its rate
# An audio sample entry's fields before its child boxes (reserved, data reference, QuickTime version and fields,
# channels, sample size, rate), and what QuickTime's sound description versions 1 and 2 add.
AUDIO_ENTRY_BYTES = 28
QT_EXTRA_BYTES = {0: 0, 1: 16, 2: 36}
UNKNOWN_DURATION = {0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF}  # mdhd's "not known": no length at all, not the longest


@dataclass(frozen=True, slots=True)
class Box:
    kind: bytes
    start: int  # its body's first byte (after the header)
    end: int
    children: tuple[Box, ...] = ()

    def find(self, kind: bytes) -> list[Box]:
        return [child for child in self.children if child.kind == kind]

    def one(self, kind: bytes, what: str) -> Box:
        found = self.find(kind)
        if len(found) != 1:
            raise LengthRefused(f"its MP4 audio track has {len(found) or 'no'} {what}")
        return found[0]


@dataclass(slots=True)
class _Walk:
    data: bytes
    boxes: int = 0

    def boxes_in(self, start: int, end: int, depth: int) -> tuple[Box, ...]:
        """The boxes from `start` to `end`, by their sizes; containers' children walked too, to MAX_DEPTH."""
        if depth > MAX_DEPTH:
            raise LengthRefused(f"its MP4 boxes nest deeper than {MAX_DEPTH}, as no real file does")
        found: list[Box] = []
        at = start
        while at < end:
            self.boxes += 1
            if self.boxes > MAX_BOXES:
                raise LengthRefused(f"it has more than {MAX_BOXES:,} MP4 boxes, more than any recording")
            if at + BOX_HEADER_BYTES > end:
                raise LengthRefused("its MP4 boxes are cut short")
            size, kind = struct.unpack_from(">I4s", self.data, at)
            header = BOX_HEADER_BYTES
            if size == 1:  # its real size is the 64-bit one after the type
                if at + LARGE_HEADER_BYTES > end:
                    raise LengthRefused("its MP4 boxes are cut short")
                size, header = struct.unpack_from(">Q", self.data, at + BOX_HEADER_BYTES)[0], LARGE_HEADER_BYTES
            elif size == 0:  # to the end of what holds it
                size = end - at
            if size < header or at + size > end:
                raise LengthRefused(f"an MP4 box ({_name(kind)}) says it is bigger than what holds it, or too small")
            children = self.boxes_in(at + header, at + size, depth + 1) if kind in CONTAINERS else ()
            found.append(Box(kind, at + header, at + size, children))
            at += size
        return tuple(found)


def mp4_seconds(data: bytes) -> float:
    """How long the MP4's one audio track plays at most, from its sample table; LengthRefused when that cannot
    be known (no moov, no or several audio tracks, fragments, a codec not counted, a box out of bounds)."""
    try:
        return _audio_seconds(_Walk(data))
    except (struct.error, IndexError):  # a field read past its box: the same as a box cut short
        raise LengthRefused("its MP4 boxes are cut short") from None


def _audio_seconds(walk: _Walk) -> float:
    top = Box(b"", 0, len(walk.data), walk.boxes_in(0, len(walk.data), 0))
    movies = top.find(b"moov")
    if len(movies) != 1:
        raise LengthRefused("it is an MP4 without its one movie box (moov), whose length is not known")
    (movie,) = movies
    # A fragmented file's samples are in moof boxes its moov does not list: its table would say a moment.
    if top.find(b"moof") or movie.find(b"mvex"):
        raise LengthRefused("it is a fragmented MP4, whose length this bot does not compute (send Ogg or M4A)")
    sounds = [track for track in movie.find(b"trak") if _handler(walk.data, track) == b"soun"]
    if len(sounds) != 1:
        raise LengthRefused(f"its MP4 has {len(sounds) or 'no'} audio tracks, where one is transcribed")
    return _track_seconds(walk, sounds[0])


def _handler(data: bytes, track: Box) -> bytes | None:
    for media in track.find(b"mdia"):
        for handler in media.find(b"hdlr"):
            at = handler.start + FULL_BOX_BYTES + 4  # after pre_defined
            return data[at : at + 4] if at + 4 <= handler.end else None
    return None


def _track_seconds(walk: _Walk, track: Box) -> float:
    data = walk.data
    media = track.one(b"mdia", "media box")
    timescale, duration = _media_header(data, media.one(b"mdhd", "media header"))
    table = media.one(b"minf", "media information").one(b"stbl", "sample table")
    ticks = _stts_ticks(data, table.one(b"stts", "time-to-sample table"))
    count = _sample_count(data, table)
    per_sample = _most_seconds_a_sample(walk, table.one(b"stsd", "sample description"))
    return max(duration / timescale, ticks / timescale, count * per_sample)


def _media_header(data: bytes, box: Box) -> tuple[int, int]:
    """mdhd's timescale and duration (0 when it says it does not know)."""
    if data[box.start] == 1:
        timescale, duration = struct.unpack_from(">IQ", data, box.start + FULL_BOX_BYTES + 16)
    else:
        timescale, duration = struct.unpack_from(">II", data, box.start + FULL_BOX_BYTES + 8)
    if timescale == 0:
        raise LengthRefused("its MP4 audio track has no timescale")
    return timescale, 0 if duration in UNKNOWN_DURATION else duration


def _stts_ticks(data: bytes, box: Box) -> int:
    """The time-to-sample table's total: each entry's sample count times its delta."""
    (entries,) = struct.unpack_from(">I", data, box.start + FULL_BOX_BYTES)
    first = box.start + FULL_BOX_BYTES + 4
    if entries > MAX_STTS_ENTRIES or first + entries * 8 > box.end:
        raise LengthRefused("its MP4 time-to-sample table is longer than its box or any recording's")
    return sum(count * delta for count, delta in struct.iter_unpack(">II", data[first : first + entries * 8]))


def _sample_count(data: bytes, table: Box) -> int:
    """How many samples the track has, by stsz (or its compact form stz2): what a demuxer hands the decoder."""
    sizes = table.find(b"stsz") + table.find(b"stz2")
    if len(sizes) != 1:
        raise LengthRefused("its MP4 audio track has no one sample size table")
    return int(struct.unpack_from(">I", data, sizes[0].start + FULL_BOX_BYTES + 4)[0])


def _most_seconds_a_sample(walk: _Walk, stsd: Box) -> float:
    """The most one sample plays, by its codec: AAC 1,024 samples at its core rate, Opus 120 ms."""
    data = walk.data
    (entries,) = struct.unpack_from(">I", data, stsd.start + FULL_BOX_BYTES)
    described = walk.boxes_in(stsd.start + FULL_BOX_BYTES + 4, stsd.end, STSD_DEPTH)
    if entries != 1 or len(described) != 1:  # samples of two codecs: each would need its own count
        raise LengthRefused("its MP4 audio track has not one sample description")
    entry = described[0]
    if entry.kind == b"Opus":
        return OPUS_MAX_PACKET_SECONDS
    if entry.kind != b"mp4a":
        raise LengthRefused(f"its MP4 audio is {_name(entry.kind)}, whose length this bot does not compute")
    version = struct.unpack_from(">H", data, entry.start + 8)[0]
    if version not in QT_EXTRA_BYTES:
        raise LengthRefused(f"its MP4 audio description is of an unknown version ({version})")
    rate = _aac_core_rate(_esds(walk, entry, version))
    if version < 2:  # versions 0 and 1 say a rate (16.16) too: the lower counts, as a lie in either lengthens it
        declared = struct.unpack_from(">I", data, entry.start + 24)[0] >> 16
        rate = min(rate, declared) if declared > 0 else rate
    return AAC_FRAME_SAMPLES / rate


def _esds(walk: _Walk, entry: Box, version: int) -> bytes:
    """The elementary stream descriptor's body: a child of mp4a, or of its QuickTime 'wave'."""
    children = walk.boxes_in(entry.start + AUDIO_ENTRY_BYTES + QT_EXTRA_BYTES[version], entry.end, ENTRY_DEPTH)
    waves = [walk.boxes_in(box.start, box.end, WAVE_DEPTH) for box in children if box.kind == b"wave"]
    found = [box for box in children + tuple(b for wave in waves for b in wave) if box.kind == b"esds"]
    if len(found) != 1:
        raise LengthRefused("its MP4 AAC audio has no one decoder configuration (esds)")
    return walk.data[found[0].start + FULL_BOX_BYTES : found[0].end]


def _aac_core_rate(esds: bytes) -> int:
    """The AAC decoder's core rate from the AudioSpecificConfig (ISO 14496-3 §1.6.2.1): what a decoder plays each
    1,024-sample frame at (with SBR, twice the samples at twice the rate: the same time)."""
    body = _descriptor(esds, ES_TAG)
    es_flags = body[2]
    at = 3 + (2 if es_flags & 0x80 else 0)  # a stream it depends on
    at += 1 + body[at] if es_flags & 0x40 else 0  # a URL, its length first
    at += 2 if es_flags & 0x20 else 0  # an OCR stream
    config = _descriptor(body[at:], DECODER_CONFIG_TAG)
    if config[0] not in AAC_OBJECT_TYPES:
        raise LengthRefused(f"its MP4 audio is not AAC (object type 0x{config[0]:02x}), whose length is not computed")
    asc = int.from_bytes(_descriptor(config[13:], DECODER_INFO_TAG)[:5].ljust(5, b"\0"), "big")
    shift = 40 - 5
    if asc >> shift == 31:  # an object type past 30: six more bits
        shift -= 6
    index = (asc >> (shift - 4)) & 0xF
    if index == AAC_EXPLICIT_RATE:
        rate = (asc >> (shift - 28)) & 0xFFFFFF
    elif index < len(AAC_RATES_HZ):
        rate = AAC_RATES_HZ[index]
    else:
        rate = 0
    if rate < AAC_MIN_RATE_HZ:
        raise LengthRefused(f"its AAC audio says a rate no encoder writes ({rate} Hz)")
    return rate


def _descriptor(data: bytes, tag: int) -> bytes:
    """An MPEG-4 descriptor's body, by its tag and its length (7 bits a byte, the high bit saying more follow)."""
    if not data or data[0] != tag:
        raise LengthRefused("its MP4 AAC decoder configuration is not one a decoder reads")
    size, at = 0, 1
    for at in range(1, 5):
        size = size << 7 | data[at] & 0x7F
        if not data[at] & 0x80:
            break
    body = data[at + 1 : at + 1 + size]
    if len(body) < size:
        raise LengthRefused("its MP4 AAC decoder configuration is cut short")
    return body


def _name(kind: bytes) -> str:
    return repr(kind.decode("latin-1"))
