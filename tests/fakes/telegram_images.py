"""Photos as Telegram handles them: only PNG, JPEG and WebP are accepted, within Telegram's dimension limits,
and each photo is kept in several sizes (thumbnails scaled to boxes of 90, 320, 800 and 1280 pixels, and the
photo itself up to 2560). Unlike Telegram, the largest size keeps the bytes as posted when the photo fits in
2,560 pixels (Telegram re-encodes it as JPEG), so a test can compare what it gets back."""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image

PHOTO_SIZE_BOXES = (90, 320, 800, 1280, 2560)  # Telegram's s, m, x, y, w sizes
MAX_PHOTO_DIMENSIONS_SUM = 10_000  # sendPhoto: width + height at most 10000
MAX_PHOTO_SIDE_RATIO = 20  # sendPhoto: width / height (either way) at most 20
THUMBNAIL_JPEG_QUALITY = 80
_FORMATS = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp"}


class PhotoError(ValueError):
    """The bytes are no photo Telegram takes; str() is Telegram's reason (IMAGE_PROCESS_FAILED, ...)."""


@dataclass(frozen=True)
class PhotoSizeData:
    """One size of a photo: its pixels and its bytes (an image file with `extension`)."""

    width: int
    height: int
    data: bytes
    extension: str


def sniff_photo(data: bytes) -> str | None:
    """The image format by its magic bytes: "JPEG", "PNG" or "WEBP"; None for anything else."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def photo_sizes(data: bytes) -> list[PhotoSizeData]:
    """The sizes Telegram keeps of a photo, smallest first; PhotoError if Telegram would refuse it."""
    kind = sniff_photo(data)
    if kind is None:
        raise PhotoError("IMAGE_PROCESS_FAILED")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            if image.format != kind:
                raise PhotoError("IMAGE_PROCESS_FAILED")
            return _sizes(image, data, _FORMATS[kind])
    except PhotoError:
        raise
    except Exception:  # Pillow: truncated, corrupt, a decompression bomb, ...
        raise PhotoError("IMAGE_PROCESS_FAILED") from None


def _sizes(image: Image.Image, data: bytes, extension: str) -> list[PhotoSizeData]:
    width, height = image.size
    longest, shortest = max(width, height), min(width, height)
    if width + height > MAX_PHOTO_DIMENSIONS_SUM or longest > MAX_PHOTO_SIDE_RATIO * shortest:
        raise PhotoError("PHOTO_INVALID_DIMENSIONS")
    sizes: list[PhotoSizeData] = []
    for box in PHOTO_SIZE_BOXES:
        if longest <= box:
            sizes.append(PhotoSizeData(width, height, data, extension))
            break
        sizes.append(_scaled(image, box / longest))
    return sizes


def _scaled(image: Image.Image, factor: float) -> PhotoSizeData:
    width = max(1, round(image.width * factor))
    height = max(1, round(image.height * factor))
    smaller = image.convert("RGB").resize((width, height), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    smaller.save(out, "JPEG", quality=THUMBNAIL_JPEG_QUALITY)
    return PhotoSizeData(width, height, out.getvalue(), ".jpg")
