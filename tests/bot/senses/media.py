"""Media for the senses' tests, made here from their formats: images (a bomb, a 12-megapixel photo, an animation
of 1,000 frames), Ogg Opus voice notes and WAV recordings of a given length."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image

OPUS_RATE_HZ = 48_000


def png(width: int, height: int, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height), (20, 120, 200, 128)[: len(mode)]).save(out, "PNG")
    return out.getvalue()


def jpeg(width: int, height: int, quality: int = 90) -> bytes:
    """A photo-like JPEG (a fractal, so it does not compress to nothing)."""
    image = Image.effect_mandelbrot((width, height), (-2.0, -1.2, 1.0, 1.2), 60).convert("RGB")
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def png_bomb(width: int = 50_000, height: int = 50_000) -> bytes:
    """A small PNG whose header declares width × height pixels (its data holds only a few rows of zeros)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = zlib.compress((b"\x00" + b"\x00" * (width * 3)) * 20, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def animated_webp(frames: int, side: int = 64) -> bytes:
    images = [Image.new("RGB", (side, side), (n % 256, 40, 90)) for n in range(frames)]
    out = io.BytesIO()
    images[0].save(out, "WEBP", save_all=True, append_images=images[1:], duration=20, lossless=False, quality=10)
    return out.getvalue()


def gif(frames: int = 3) -> bytes:
    images = [Image.new("P", (40, 30), n) for n in range(frames)]
    out = io.BytesIO()
    images[0].save(out, "GIF", save_all=True, append_images=images[1:])
    return out.getvalue()


def zip_file() -> bytes:
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("secret.txt", "not an image")
    return out.getvalue()


def _ogg_crc(data: bytes) -> int:
    """Ogg's CRC-32 (polynomial 0x04C11DB7, not reflected), bit by bit as its specification has it."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7 if crc & 0x80000000 else crc << 1) & 0xFFFFFFFF
    return crc


def ogg_page(granule: int, sequence: int, packets: list[bytes], flags: int = 0, serial: int = 7) -> bytes:
    """One page holding these whole packets, its checksum right (a demuxer skips a page whose checksum is not)."""
    segments = []
    for packet in packets:
        segments += [255] * (len(packet) // 255) + [len(packet) % 255]
    header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, serial, sequence, 0, len(segments))
    page = header + bytes(segments) + b"".join(packets)
    return page[:22] + struct.pack("<I", _ogg_crc(page)) + page[26:]


OPUS_HEAD = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, 312, 16_000, 0, 0)
OPUS_TAGS = b"OpusTags" + struct.pack("<I", 4) + b"test" + struct.pack("<I", 0)


def ogg_opus(seconds: float, packet: bytes = b"\xfc" * 40, packets_a_page: int = 1, pages: int = 4) -> bytes:
    """An Ogg Opus stream's pages as a voice note has them (head, tags, then audio pages), `seconds` long by its
    last granule position; the packets (20 ms CELT ones by their TOC byte, 0xfc) are not real Opus, which only
    the service would notice."""
    out = [ogg_page(0, 0, [OPUS_HEAD], flags=2), ogg_page(0, 1, [OPUS_TAGS])]
    total = int(seconds * OPUS_RATE_HZ)
    for n in range(1, pages + 1):
        out.append(ogg_page(total * n // pages, 1 + n, [packet] * packets_a_page, flags=4 if n == pages else 0))
    return b"".join(out)


def wav(seconds: float, rate: int = 8_000) -> bytes:
    """A silent 16-bit mono WAV of `seconds`."""
    frames = int(seconds * rate)
    data = b"\x00\x00" * frames
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + len(data))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )
