"""Audio by its bytes: what is not audio is refused before it costs a call, and a voice note's length is read
from its container when the platform did not say it."""

from __future__ import annotations

import struct

import pytest

from bot.senses.audio_sniff import MAX_WAV_CHUNKS, audio_format, audio_seconds, most_seconds
from tests.bot.senses.media import jpeg, ogg_opus, wav, zip_file


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
    assert audio_seconds(b"ID3\x04\x00" + b"\x00" * 100) is None  # mp3: not known cheaply
    assert audio_seconds(b"OggS" + b"\x00" * 60) is None  # no Opus or Vorbis head


def test_a_wav_of_endless_empty_chunks_is_not_walked_to_its_end() -> None:
    # 25 MB of 8-byte empty chunks is three million of them: only the first MAX_WAV_CHUNKS are read, then no
    # length (the file is then bounded by its size, like any file whose length cannot be read).
    empty = b"junk" + struct.pack("<I", 0)
    data = b"RIFF" + struct.pack("<I", 0) + b"WAVE" + empty * (MAX_WAV_CHUNKS + 1) + wav(1.0)[12:]
    assert audio_seconds(data) is None
    assert audio_seconds(b"RIFF\x00\x00\x00\x00WAVE" + empty * (MAX_WAV_CHUNKS - 3) + wav(1.0)[12:]) == 1.0


def test_the_most_a_file_can_play_is_its_bits_at_its_formats_lowest_bitrate() -> None:
    assert most_seconds("mp3", 1_000) == 1.0  # 8 kbit/s
    assert most_seconds("ogg", 750) == 1.0  # 6 kbit/s
