"""A file goes as a photo only when its bytes are a PNG, JPEG or WebP within Telegram's photo limits."""

from __future__ import annotations

import io
import random
import struct
import time
import zlib

import pytest

from runner.channel.photo_kind import (
    MAX_PHOTO_BYTES,
    PHOTO_HEAD_BYTES,
    Photo,
    PhotoFormat,
    photo_of,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_chunk(kind: bytes, data: bytes) -> bytes:
    # Length (big-endian, of the data only), type, data, CRC-32 over type and data.
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header(width: int, height: int) -> bytes:
    # Signature and IHDR: width, height, bit depth 8, colour type 0 (grey), compression, filter, interlace 0.
    return PNG_SIGNATURE + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))


def png(width: int, height: int) -> bytes:
    """A whole, decodable grey PNG: each row is filter byte 0 then `width` zero pixels."""
    rows = b"".join(b"\x00" + bytes(width) for _ in range(height))
    return png_header(width, height) + png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b"")


def segment(marker: int, body: bytes) -> bytes:
    # A JPEG marker segment: FF, the marker, a big-endian length counting itself (2) and the body.
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


# APP0 "JFIF": identifier "JFIF\0", version 1.01, units 0, density 1 x 1, no thumbnail (14 bytes, length 16).
JFIF = segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
# SOS for three components (each: id, DC/AC tables), then spectral start 0, end 63, approximation 0.
SOS = segment(0xDA, b"\x03\x01\x00\x02\x11\x03\x11\x00\x3f\x00")


def sof(width: int, height: int, marker: int = 0xC0) -> bytes:
    # Frame header: precision 8, Y (height), X (width), Nf = 3, then per component id, sampling, quant table;
    # so its length is 8 + 3 * 3 = 17.
    components = b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return segment(marker, struct.pack(">BHHB", 8, height, width, 3) + components)


def jpeg_header(width: int, height: int, *, marker: int = 0xC0, before: bytes = JFIF) -> bytes:
    """SOI, the segments before the frame, the frame header: all photo_of needs of a JPEG."""
    return b"\xff\xd8" + before + sof(width, height, marker)


def riff_webp(fourcc: bytes, data: bytes) -> bytes:
    # RIFF, its size (little-endian: all after these 8 bytes), WEBP, one chunk: FourCC, size, data.
    chunk = fourcc + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def webp_lossy(width: int, height: int, *, scale: int = 0) -> bytes:
    # Frame tag (24 bits LE): bit 0 = 0 key frame, bits 1-3 version 0, bit 4 show frame, the rest the first
    # partition's size (here 0): 0x10 00 00. Start code 9D 01 2A. Width and height: 16 bits LE each, the low
    # 14 the size and the top 2 an upscaling factor.
    size = struct.pack("<HH", width | scale << 14, height | scale << 14)
    return riff_webp(b"VP8 ", b"\x10\x00\x00\x9d\x01\x2a" + size)


def webp_lossless(width: int, height: int) -> bytes:
    # Signature 0x2F, then 32 bits LE: width - 1 (14 bits), height - 1 (14), alpha used (1), version 0 (3).
    return riff_webp(b"VP8L", b"\x2f" + struct.pack("<I", (width - 1) | (height - 1) << 14))


def webp_extended(width: int, height: int, *, flags: int = 0x10) -> bytes:
    # Flags (0x10 alpha, 0x02 animation), 3 reserved bytes, canvas width - 1 and height - 1 (24 bits LE each).
    canvas = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return riff_webp(b"VP8X", bytes([flags, 0, 0, 0]) + canvas)


HEADERS: dict[PhotoFormat, list[bytes]] = {
    PhotoFormat.PNG: [png_header(640, 480), png(37, 5)],
    PhotoFormat.JPEG: [jpeg_header(640, 480), jpeg_header(640, 480) + SOS + b"\x00" * 8 + b"\xff\xd9"],
    PhotoFormat.WEBP: [webp_lossy(640, 480), webp_lossless(640, 480), webp_extended(640, 480)],
}
# Each the shortest: every byte of it is needed.
MINIMAL = [png_header(640, 480), jpeg_header(640, 480), webp_lossy(640, 480), webp_lossless(640, 480)]
MINIMAL.append(webp_extended(640, 480))


def photo(data: bytes, size_bytes: int | None = None) -> Photo | None:
    return photo_of(data, len(data) if size_bytes is None else size_bytes)


def assert_sane(result: Photo | None) -> None:
    if result is not None:
        assert result.width > 0 and result.height > 0 and result.width + result.height <= 10_000
        assert max(result.width, result.height) <= 20 * min(result.width, result.height)
        assert result.mime_type == f"image/{result.format.value}"


@pytest.mark.parametrize("kind", list(PhotoFormat))
def test_each_format_is_recognised_with_its_dimensions(kind: PhotoFormat) -> None:
    for data in HEADERS[kind]:
        expected = (37, 5) if data == png(37, 5) else (640, 480)
        assert photo(data) == Photo(kind, *expected, f"image/{kind.value}")


def test_hand_built_png_and_jpeg_read_as_pillow_reads_them() -> None:
    # Pillow's parsers check the hand derivations above; it reads a JPEG's size from its frame header alone.
    image = pytest.importorskip("PIL.Image")
    assert image.open(io.BytesIO(png(37, 5))).size == (37, 5)
    assert image.open(io.BytesIO(jpeg_header(640, 480) + SOS + b"\xff\xd9")).size == (640, 480)


@pytest.mark.parametrize(
    ("fmt", "options"),
    [
        ("JPEG", {}),
        ("JPEG", {"progressive": True}),
        ("JPEG", {"exif": b"Exif\x00\x00" + b"\x00" * 30_000}),  # the frame header after a 30 kB APP1
        ("PNG", {}),
        ("WEBP", {}),
        ("WEBP", {"lossless": True}),
        ("WEBP", {"exif": b"Exif\x00\x00II*\x00\x08\x00\x00\x00\x00\x00"}),  # written as VP8X
    ],
)
def test_files_pillow_writes_are_recognised(fmt: str, options: dict[str, object]) -> None:
    image = pytest.importorskip("PIL.Image")
    for size in [(37, 5), (1, 1), (401, 2999)]:
        out = io.BytesIO()
        image.new("RGB", size).save(out, fmt, **options)
        result = photo(out.getvalue())
        assert result is not None and (result.width, result.height) == size
        assert result.format.value == fmt.lower()


def test_limits_are_telegrams() -> None:
    for build in [png_header, jpeg_header, webp_lossy, webp_lossless, webp_extended]:
        assert photo(build(5000, 5000)) is not None and photo(build(5001, 5000)) is None  # sides' sum 10000
        assert photo(build(400, 20)) is not None and photo(build(20, 400)) is not None  # ratio 20
        assert photo(build(420, 20)) is None and photo(build(20, 420)) is None  # ratio 21
        assert photo(build(1, 1)) is not None
    data = png_header(640, 480)
    assert photo(data, MAX_PHOTO_BYTES) is not None
    assert photo(data, MAX_PHOTO_BYTES + 1) is None
    assert photo(data, len(data) - 1) is None and photo(data, 0) is None and photo(data, -1) is None


def test_png_signature_without_a_real_header_is_a_document() -> None:
    assert photo(PNG_SIGNATURE + b"hello, this is a text file and not an image at all\n") is None
    # IHDR's CRC must hold: dimensions in a corrupted header are not trusted.
    data = bytearray(png_header(640, 480))
    data[-1] ^= 1
    assert photo(bytes(data)) is None
    assert photo(png_header(0, 480)) is None and photo(png_header(640, 0)) is None


def test_jpeg_walk_finds_every_frame_header_and_no_other_marker() -> None:
    for marker in [0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF]:
        assert photo(jpeg_header(300, 200, marker=marker)) == Photo(PhotoFormat.JPEG, 300, 200, "image/jpeg")
    # DHT, JPG and DAC are shaped like a frame header here, yet are not one.
    for marker in [0xC4, 0xC8, 0xCC]:
        assert photo(jpeg_header(300, 200, marker=marker)) is None
        assert photo(jpeg_header(300, 200, before=JFIF + sof(9, 9, marker))) == photo(jpeg_header(300, 200))


def test_jpeg_walk_skips_fill_bytes_standalone_markers_and_metadata() -> None:
    before = b"\xff\xff\xff" + JFIF + b"\xff\xd0\xff\x01" + segment(0xE1, b"Exif\x00\x00" + bytes(60_000))
    assert photo(jpeg_header(300, 200, before=before)) == Photo(PhotoFormat.JPEG, 300, 200, "image/jpeg")


def test_jpeg_frame_header_past_the_head_is_a_document() -> None:
    data = jpeg_header(300, 200)
    padding = segment(0xE1, bytes(PHOTO_HEAD_BYTES - len(data) - 4))  # the frame header ends at the head's end
    assert len(jpeg_header(300, 200, before=JFIF + padding)) == PHOTO_HEAD_BYTES
    assert photo(jpeg_header(300, 200, before=JFIF + padding)) is not None
    assert photo(jpeg_header(300, 200, before=JFIF + padding + b"\xff")) is None


def test_jpeg_bad_segments_are_documents() -> None:
    for length in [0, 1]:
        assert photo(b"\xff\xd8\xff\xe0" + struct.pack(">H", length) + sof(300, 200)) is None
    assert photo(b"\xff\xd8" + JFIF + b"\x00" + sof(300, 200)) is None  # no marker where one must be
    assert photo(b"\xff\xd8" + JFIF + SOS + sof(300, 200)) is None  # image data began: no frame header
    assert photo(b"\xff\xd8" + JFIF + b"\xff\xd9" + sof(300, 200)) is None
    bad_count = bytearray(jpeg_header(300, 200))
    bad_count[-10] = 4  # Nf = 4 with a length made for 3
    assert photo(bytes(bad_count)) is None
    assert photo(jpeg_header(300, 0)) is None  # height 0: defined later by a DNL segment
    assert photo(jpeg_header(0, 200)) is None


def test_webp_variants() -> None:
    # The scale bits are not size.
    assert photo(webp_lossy(300, 200, scale=3)) == Photo(PhotoFormat.WEBP, 300, 200, "image/webp")
    assert photo(webp_extended(300, 200, flags=0x12)) is None  # animated
    not_key_frame = bytearray(webp_lossy(300, 200))
    not_key_frame[20] |= 1
    assert photo(bytes(not_key_frame)) is None
    bad_version = bytearray(webp_lossless(300, 200))
    bad_version[24] |= 0x20
    assert photo(bytes(bad_version)) is None
    assert photo(riff_webp(b"VP8L", b"\x2e" + bytes(4))) is None
    assert photo(riff_webp(b"ALPH", bytes(10))) is None
    assert photo(webp_lossy(0, 200)) is None


def test_every_truncation_of_a_header_is_a_document() -> None:
    for data in MINIMAL:
        assert photo(data) is not None
        for length in range(len(data)):
            assert photo(data[:length], len(data)) is None, (data, length)


def test_other_files_are_documents() -> None:
    gif = b"GIF89a\x20\x00\x10\x00\x80\x00\x00" + bytes(20)
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>'
    bmp = b"BM" + bytes(60)
    for data in [gif, svg, bmp, b"", b"\xff\xd8", b"RIFF\x00\x00\x00\x00WAVEfmt ", png_header(640, 480)[1:]]:
        assert photo(data) is None
    assert photo_of(b"", 100) is None


def test_worst_case_heads_end_quickly() -> None:
    started = time.monotonic()
    for data in [b"\xff\xd8" + b"\xff" * PHOTO_HEAD_BYTES, b"\xff\xd8" + b"\xff\xe0\x00\x02" * 20_000]:
        assert photo(data) is None
        assert photo(b"\xff\xd8" + b"\xff\x01" * 40_000) is None
    assert time.monotonic() - started < 2


def test_random_bytes_never_raise() -> None:
    rng = random.Random(1729)
    prefixes = [b"", PNG_SIGNATURE, PNG_SIGNATURE + b"\x00\x00\x00\x0dIHDR", b"\xff\xd8", b"\xff\xd8\xff"]
    prefixes += [b"RIFF\x00\x00\x00\x00WEBP" + fourcc for fourcc in [b"VP8 ", b"VP8L", b"VP8X"]]
    # JPEG walks meet markers far more often when the bytes come from markers' own alphabet.
    alphabet = [0x00, 0x01, 0x02, 0x08, 0x11, 0xC0, 0xC4, 0xCC, 0xD0, 0xD8, 0xD9, 0xDA, 0xE0, 0xFF, 0xFF]
    for _ in range(2000):
        if rng.random() < 0.5:
            tail = rng.randbytes(rng.randrange(300))
        else:
            tail = bytes(rng.choice(alphabet) for _ in range(rng.randrange(300)))
        data = rng.choice(prefixes) + tail
        assert_sane(photo_of(data, rng.choice([len(data), len(data) + rng.randrange(2**24), rng.randrange(-5, 50)])))


def test_mutated_headers_never_raise() -> None:
    rng = random.Random(4104)
    valid = [data for datas in HEADERS.values() for data in datas] + [jpeg_header(640, 480) + SOS]
    for _ in range(2000):
        data = bytearray(rng.choice(valid))
        for _ in range(rng.randrange(1, 5)):
            at = rng.randrange(len(data))
            action = rng.randrange(4)
            if action == 0:
                data[at] = rng.randrange(256)
            elif action == 1:
                data.insert(at, rng.choice([0x00, 0xFF, rng.randrange(256)]))
            elif action == 2:
                del data[at]
            else:
                data[at] ^= 1 << rng.randrange(8)
        assert_sane(photo(bytes(data)))
