"""An MP4's audio length by its sample table (bot/senses/mp4_length.py): a video note or an .m4a is measured by
its AAC frames, never by the durations its header declares, and a file whose boxes are out of bounds, nest too
deep, hold no or several audio tracks, come in fragments or carry a codec not counted is refused, saying why."""

from __future__ import annotations

import struct

import pytest

from bot.senses.audio_sniff import measure_audio
from bot.senses.mp4_length import MAX_BOXES, MAX_DEPTH, mp4_seconds
from bot.senses.ogg_length import LengthRefused
from tests.bot.senses.mp4_media import box, esds, full_box, mp4_audio, mp4a, track


def test_a_video_note_and_an_m4a_play_their_frames() -> None:
    note = mp4_audio(130)  # 130 frames of 1,024 samples at 44.1 kHz, beside 3 s of H.264
    assert mp4_seconds(note) == pytest.approx(130 * 1_024 / 44_100)
    found = measure_audio(note)
    assert found is not None and found.complete and found.seconds == pytest.approx(3.0186, abs=1e-3)
    assert mp4_seconds(mp4_audio(500, 16_000, video=False)) == pytest.approx(32.0)


def test_a_header_claiming_10_seconds_over_100000_frames_plays_the_frames() -> None:
    # mdhd and stts both say 480,000 ticks at 48 kHz (10 s); stsz lists 100,000 AAC frames: 35 minutes decoded.
    data = mp4_audio(100_000, 48_000, declared_ticks=480_000)
    assert len(data) < 25 * 1024 * 1024
    assert mp4_seconds(data) == pytest.approx(100_000 * 1_024 / 48_000)


def test_the_longest_of_mdhd_stts_and_the_frames_counts() -> None:
    # Fewer frames than the header says: the header's 60 s counts (a decoder may pad to it; it is never less).
    assert mp4_seconds(mp4_audio(10, 8_000, declared_ticks=60 * 8_000)) == pytest.approx(60.0)


def test_aac_frames_are_timed_at_the_lower_of_the_decoder_and_entry_rates() -> None:
    # The entry says 48 kHz, the decoder's configuration 8 kHz: a decoder plays each frame 128 ms, not 21 ms.
    slow_decoder = mp4_audio(100, 48_000, video=False, entry=mp4a(48_000, esds(8_000)))
    assert mp4_seconds(slow_decoder) == pytest.approx(100 * 1_024 / 8_000)
    slow_entry = mp4_audio(100, 48_000, video=False, entry=mp4a(8_000, esds(96_000)))
    assert mp4_seconds(slow_entry) == pytest.approx(100 * 1_024 / 8_000)
    explicit_1_hz = bytes([0x17, 0x80, 0x00, 0x00, 0x80])  # AAC LC, index 15, then a 24-bit rate of 1 Hz
    with pytest.raises(LengthRefused, match=r"a rate no encoder writes \(1 Hz\)"):
        mp4_seconds(mp4_audio(100, video=False, entry=mp4a(decoder=esds(asc=explicit_1_hz))))


def test_opus_in_mp4_counts_each_packet_as_120_ms() -> None:
    opus = box(b"Opus", bytes(6), struct.pack(">H", 1), bytes(8), struct.pack(">HHHHI", 1, 16, 0, 0, 48_000 << 16))
    assert mp4_seconds(mp4_audio(100, 48_000, video=False, entry=opus)) == pytest.approx(12.0)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (box(b"alac", bytes(28)), "its MP4 audio is 'alac', whose length this bot does not compute"),
        (mp4a(decoder=esds(object_type=0x6B)), r"not AAC \(object type 0x6b\)"),  # MP3 in MP4: 1,152-sample frames
        (mp4a(decoder=b""), "no one decoder configuration"),
        (mp4a(decoder=full_box(b"esds", b"\x03\x40\x00")), "cut short"),
    ],
)
def test_codecs_not_counted_and_bad_decoder_configurations_are_refused(entry: bytes, reason: str) -> None:
    with pytest.raises(LengthRefused, match=reason):
        mp4_seconds(mp4_audio(100, video=False, entry=entry))


def _top(data: bytes, kind: bytes) -> int:
    """Where a box of this kind starts (its size field)."""
    return data.index(kind) - 4


def test_box_sizes_out_of_bounds_are_refused() -> None:
    note = mp4_audio(130)
    with pytest.raises(LengthRefused, match="bigger than what holds it"):
        mp4_seconds(note[:-10])  # truncated: the mdat says more than the file has
    with pytest.raises(LengthRefused):
        mp4_seconds(note[: _top(note, b"stsz") + 10])  # cut inside the moov
    overlapping = bytearray(note)  # stsz says it runs over the stco after it and out of its stbl
    struct.pack_into(">I", overlapping, _top(note, b"stsz"), 4_000)
    with pytest.raises(LengthRefused, match=r"\('stsz'\) says it is bigger"):
        mp4_seconds(bytes(overlapping))
    huge = bytearray(note)
    struct.pack_into(">I", huge, _top(note, b"moov"), 0xFFFFFFFF)
    with pytest.raises(LengthRefused, match="bigger than what holds it"):
        mp4_seconds(bytes(huge))
    tiny = bytearray(note)
    struct.pack_into(">I", tiny, _top(note, b"moov"), 4)  # smaller than its own header: a walk that never moves
    with pytest.raises(LengthRefused, match="too small"):
        mp4_seconds(bytes(tiny))


def test_64_bit_sizes_and_a_last_box_to_the_end_are_walked() -> None:
    note = mp4_audio(130)
    mdat = _top(note, b"mdat")
    large = note[:mdat] + struct.pack(">I4sQ", 1, b"mdat", len(note) - mdat + 8) + note[mdat + 8 :]
    assert mp4_seconds(large) == pytest.approx(130 * 1_024 / 44_100)
    to_end = note[:mdat] + struct.pack(">I", 0) + note[mdat + 4 :]
    assert mp4_seconds(to_end) == pytest.approx(130 * 1_024 / 44_100)
    huge = note[:mdat] + struct.pack(">I4sQ", 1, b"mdat", 2**63) + note[mdat + 8 :]
    with pytest.raises(LengthRefused, match="bigger than what holds it"):
        mp4_seconds(huge)


def test_boxes_nested_too_deep_are_refused() -> None:
    nested = mp4a()
    for _ in range(MAX_DEPTH + 2):
        nested = box(b"trak", nested)
    with pytest.raises(LengthRefused, match="nest deeper than"):
        mp4_seconds(mp4_audio(130, moov_extra=nested))


def test_a_moov_behind_too_many_boxes_or_none_is_refused() -> None:
    note = mp4_audio(130)
    ftyp = note[: _top(note, b"moov")]
    with pytest.raises(LengthRefused, match=f"more than {MAX_BOXES:,} MP4 boxes"):
        mp4_seconds(ftyp + box(b"free") * MAX_BOXES + note[len(ftyp) :])
    with pytest.raises(LengthRefused, match="without its one movie box"):
        mp4_seconds(ftyp + box(b"mdat", bytes(1_000)))
    with pytest.raises(LengthRefused, match="without its one movie box"):
        measure_audio(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 1_000)  # no box after the ftyp: size 0, to the end


def test_no_audio_track_several_or_fragments_are_refused() -> None:
    video_only = mp4_audio(130)
    video_only = video_only.replace(b"soun", b"text")
    with pytest.raises(LengthRefused, match="has no audio tracks"):
        mp4_seconds(video_only)
    second = track(b"soun", 44_100, 1_024, mp4a(), 1, (1, 1_024), 0)
    with pytest.raises(LengthRefused, match="has 2 audio tracks"):
        mp4_seconds(mp4_audio(130, more_tracks=(second,)))
    with pytest.raises(LengthRefused, match="fragmented MP4"):
        mp4_seconds(mp4_audio(130, moov_extra=box(b"mvex", full_box(b"trex", bytes(20)))))
    with pytest.raises(LengthRefused, match="fragmented MP4"):
        mp4_seconds(mp4_audio(130) + box(b"moof", full_box(b"mfhd", bytes(4))))


def test_a_time_table_longer_than_its_box_is_refused() -> None:
    note = bytearray(mp4_audio(130))
    stts = note.index(b"stts", note.index(b"soun")) - 4  # the audio track's
    struct.pack_into(">I", note, stts + 12, 0xFFFFFFFF)  # entry count: 34 GB of entries in a 24-byte box
    with pytest.raises(LengthRefused, match="time-to-sample table is longer"):
        mp4_seconds(bytes(note))
