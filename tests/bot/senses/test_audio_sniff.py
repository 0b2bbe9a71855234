"""Audio by its bytes: what is not audio is refused before it costs a call, and a file's length is computed from
its own bytes (Ogg's packets, WAV's samples, an MP4's audio frames), never taken from a header its sender wrote;
a format whose length cannot be computed is refused."""

from __future__ import annotations

import struct

import pytest

from bot.senses.audio_sniff import MAX_WAV_CHUNKS, audio_format, audio_seconds, measure_audio, most_seconds
from bot.senses.ogg_length import LengthRefused
from tests.bot.senses.media import OPUS_RATE_HZ, jpeg, ogg_opus, ogg_page, wav, zip_file
from tests.bot.senses.mp4_media import mp4_audio


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"OggS\x00\x02", "ogg"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", "wav"),
        (b"ID3\x04\x00", "mp3"),
        (b"\xff\xfb\x90\x64", "mp3"),
        (b"\x00\x00\x00\x20ftypM4A ", "m4a"),
        (b"\x00\x00\x00\x18ftypmp42", "m4a"),
        (b"fLaC\x00", "flac"),
        (b"\x1a\x45\xdf\xa3\x01", "webm"),
        (b"\xff\xf1\x50\x80", "aac"),
        (b"#!AMR\n", "amr"),
    ],
)
def test_audio_formats_by_their_magic(head: bytes, kind: str) -> None:
    assert audio_format(head) == kind


@pytest.mark.parametrize("data", [b"", b"hello, I am text", b"%PDF-1.7", b"\x89PNG\r\n\x1a\n"])
def test_what_is_not_audio_is_none(data: bytes) -> None:
    assert audio_format(data) is None
    assert audio_format(zip_file()) is None
    assert audio_format(jpeg(10, 10)) is None


def test_lengths_of_ogg_opus_and_wav() -> None:
    assert audio_seconds(ogg_opus(12.5)) == pytest.approx(12.5)
    assert audio_seconds(ogg_opus(3 * 3600)) == pytest.approx(10_800)
    assert audio_seconds(wav(2.0)) == pytest.approx(2.0)
    assert audio_seconds(b"ID3\x04\x00" + b"\x00" * 100) is None  # mp3: bounded by its size instead
    with pytest.raises(LengthRefused, match="not a readable Ogg file"):
        audio_seconds(b"OggS" + b"\x00" * 60)  # no page whose checksum holds


def test_an_ogg_whose_last_page_claims_40_seconds_plays_what_its_packets_say() -> None:
    # 2-byte Opus packets (TOC 0x1b: SILK 60 ms, code 3; count byte 2: 120 ms each): a header's granule of 40 s
    # over 25,500 of them, which a decoder plays for 51 minutes.
    audio = [ogg_page(0, 2 + n, [b"\x1b\x02"] * 255) for n in range(99)]
    last = ogg_page(40 * OPUS_RATE_HZ, 101, [b"\x1b\x02"] * 255, flags=4)
    data = ogg_opus(0, pages=0) + b"".join(audio) + last
    assert len(data) < 80_000
    assert audio_seconds(data) == pytest.approx(100 * 255 * 0.120)


@pytest.mark.parametrize(
    ("packet", "ms"),
    [
        (b"\x00", 10),  # SILK 10 ms, one frame
        (b"\x19", 120),  # SILK 60 ms, two frames
        (b"\xfe", 40),  # CELT 20 ms, two frames of different sizes
        (b"\x03\x05", 50),  # SILK 10 ms, code 3: five frames
        (b"\x83" + bytes([48]), 120),  # CELT 2.5 ms × 48
        (b"\x03\x00", 120),  # code 3 of no frames: no decoder takes it, counted as the longest
        (b"\x03", 120),  # code 3 without its count
        (b"\xfb" + bytes([48]), 120),  # 48 frames of 20 ms: over 120 ms, not valid, the longest
        (b"", 120),  # empty
    ],
)
def test_each_opus_packet_plays_what_its_toc_byte_says(packet: bytes, ms: int) -> None:
    data = ogg_opus(0, pages=0) + ogg_page(0, 2, [packet] * 10, flags=4)
    assert audio_seconds(data) == pytest.approx(10 * ms / 1000)


def test_the_walk_stops_just_past_enough() -> None:
    data = ogg_opus(0, packet=b"\x1b\x02", packets_a_page=255, pages=50)  # 1,530 s
    found = measure_audio(data, enough=300)
    assert found is not None and not found.complete and 300 < found.seconds < 300 + 255 * 0.120
    whole = measure_audio(data)
    assert whole is not None and whole.complete and whole.seconds == pytest.approx(1_530)


def test_pages_are_found_as_a_demuxer_finds_them() -> None:
    audio = ogg_page(0, 2, [b"\x1b\x02"] * 100)  # 12 s
    # A fake page whose lacing claims the next page as its body, with a wrong checksum: a demuxer skips it and
    # finds the page inside, so the walk must too; garbage between pages is skipped the same way.
    fake = bytearray(ogg_page(0, 9, [b"x" * len(audio)]))
    fake[22] ^= 0xFF
    data = ogg_opus(0, pages=0) + bytes(fake[: -len(audio)]) + audio + b"junk" + audio
    assert audio_seconds(data) == pytest.approx(24.0)


def test_an_ogg_of_another_stream_or_codec_or_of_bytes_that_are_no_audio_is_refused() -> None:
    second = ogg_page(0, 0, [b"\xfc" * 40], serial=8)
    with pytest.raises(LengthRefused, match="more than one Ogg stream"):
        audio_seconds(ogg_opus(1.0) + second)
    with pytest.raises(LengthRefused, match="not Opus or Vorbis"):
        audio_seconds(ogg_page(0, 0, [b"Speex   " + bytes(72)], flags=2))
    with pytest.raises(LengthRefused, match="more bytes than"):
        audio_seconds(ogg_opus(1.0) + b"\x00" * 2_000_000)  # 2 MB "of one second"


def test_ogg_vorbis_counts_each_packet_as_its_longest_block() -> None:
    ident = b"\x01vorbis" + struct.pack("<IBIiiiB", 0, 1, 8_000, 0, 0, 0, 0xB8) + b"\x01"  # blocks 256 and 2048
    head = ogg_page(0, 0, [ident], flags=2) + ogg_page(0, 1, [b"\x03vorbis", b"\x05vorbis"])
    data = head + ogg_page(8_000, 2, [b"\x00"] * 250, flags=4)  # 250 packets × 1,024 samples at 8 kHz
    assert audio_seconds(data) == pytest.approx(32.0)


def test_a_wav_is_its_samples_whatever_byte_rate_it_declares() -> None:
    lying = bytearray(wav(50.0))
    struct.pack_into("<I", lying, lying.find(b"fmt ") + 16, 0xFFFFFFFF)  # nAvgBytesPerSec: no decoder uses it
    assert audio_seconds(bytes(lying)) == pytest.approx(50.0)
    small_align = bytearray(wav(2.0))
    struct.pack_into("<H", small_align, small_align.find(b"fmt ") + 20, 1)  # block align 1 of 16-bit frames
    assert audio_seconds(bytes(small_align)) == pytest.approx(4.0)  # the smaller frame: a lie only lengthens it


def test_a_wav_of_compressed_audio_or_no_samples_is_refused() -> None:
    adpcm = bytearray(wav(2.0))
    struct.pack_into("<H", adpcm, adpcm.find(b"fmt ") + 8, 0x0002)
    with pytest.raises(LengthRefused, match="compressed"):
        audio_seconds(bytes(adpcm))
    no_rate = bytearray(wav(2.0))
    struct.pack_into("<I", no_rate, no_rate.find(b"fmt ") + 12, 0)
    with pytest.raises(LengthRefused, match="no samples"):
        audio_seconds(bytes(no_rate))


@pytest.mark.parametrize("head", [b"\x1a\x45\xdf\xa3\x01", b"fLaC\x00", b"\xff\xf1\x50\x80", b"#!AMR\n"])
def test_formats_whose_length_a_sender_can_fake_are_refused(head: bytes) -> None:
    with pytest.raises(LengthRefused, match=r"cannot be computed from its bytes \(send Ogg, WAV, MP3 or M4A\)"):
        measure_audio(head + b"\x00" * 1_000)


def test_an_mp4_is_measured_by_its_audio_frames_not_refused_by_its_kind() -> None:
    found = measure_audio(mp4_audio(500, 16_000))  # a video note's AAC track: 500 frames at 16 kHz
    assert found is not None and found.complete and found.seconds == pytest.approx(32.0)
    with pytest.raises(LengthRefused, match="without its one movie box"):
        measure_audio(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 1_000)  # an ftyp and nothing an MP4 plays


def test_a_wav_of_endless_empty_chunks_is_not_walked_to_its_end() -> None:
    # 25 MB of 8-byte empty chunks is three million of them: only the first MAX_WAV_CHUNKS are read, then refused.
    empty = b"junk" + struct.pack("<I", 0)
    data = b"RIFF" + struct.pack("<I", 0) + b"WAVE" + empty * (MAX_WAV_CHUNKS + 1) + wav(1.0)[12:]
    with pytest.raises(LengthRefused, match="do not lead to its audio"):
        audio_seconds(data)
    assert audio_seconds(b"RIFF\x00\x00\x00\x00WAVE" + empty * (MAX_WAV_CHUNKS - 3) + wav(1.0)[12:]) == 1.0


def test_the_most_an_mp3_can_play_is_its_bits_at_its_lowest_bitrate() -> None:
    assert most_seconds("mp3", 1_000) == 1.0  # 8 kbit/s
