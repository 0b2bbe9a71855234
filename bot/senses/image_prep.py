"""An image posted in a chat, made ready for the model: decoded with limits, downscaled to at most MAX_SIDE_PX on
its long side and re-encoded as a JPEG. Blocking and CPU-bound: run it in a thread (bot/senses/seen_images.py).

Posted images are hostile input. Only PNG, JPEG, WebP and GIF are opened, chosen by their bytes (a ZIP named
`photo.png` is refused unread). The size in the header decides before any pixel is decoded: a JPEG is decoded
at a reduced scale (`draft`: the decoder's DCT scaling, up to 1/8 a side) so a 12-megapixel photo never needs its
full 36 MB of pixels; other formats have no such scaling, so their pixels are bounded by MAX_FULL_DECODE_PIXELS.
An animation gives its first frame only (the others are never decoded). A truncated file fails to decode and is
refused, never shown half grey.

Pillow is imported on the first image, not at start (75 ms and 3 MiB a bot with no images never pays).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import ImageFile

MAX_SIDE_PX = 1_568  # the long side sent: Anthropic's largest without its own resizing, OpenAI's high detail fits it
JPEG_QUALITY = 85
REDUCING_GAP = 2.0
# A JPEG decoded at 1/8 a side from this many pixels is 1.9 MP (6 MB of RGB) at most.
MAX_JPEG_PIXELS = 120_000_000
# Formats decoded at full size: 16.7 MP is 64 MiB as RGBA, the most one decode may take.
MAX_FULL_DECODE_PIXELS = 4_096 * 4_096
MIN_SIDE_PX = 1
_FORMATS = {"JPEG": "JPEG", "PNG": "PNG", "WEBP": "WebP", "GIF": "GIF"}
_BACKGROUND = (255, 255, 255)  # transparency (stickers, screenshots with alpha) is shown on white


class ImageRefused(Exception):
    """The bytes are not an image the model is shown: the message says why, for the chat's history."""


@dataclass(frozen=True, slots=True)
class PreparedImage:
    data: bytes  # JPEG
    width: int  # as sent
    height: int
    source_format: str  # JPEG, PNG, WebP or GIF
    source_width: int
    source_height: int
    media_type: str = "image/jpeg"


def sniff_format(head: bytes) -> str | None:
    """The image format by its first bytes (PIL's names), None for anything else."""
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    return None


def prepare_image(data: bytes, max_side: int = MAX_SIDE_PX) -> PreparedImage:
    """The image as the model gets it; ImageRefused says why not (never another exception for bad bytes)."""
    from PIL import Image, UnidentifiedImageError

    kind = sniff_format(data[:16])
    if kind is None:
        raise ImageRefused("it is not a PNG, JPEG, WebP or GIF image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[kind]) as image:
                return _prepared(image, kind, max_side)
    except ImageRefused:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageRefused("it declares more pixels than an image is decoded with") from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError, UnidentifiedImageError) as exc:
        raise ImageRefused(f"it cannot be decoded ({_short(exc)})") from None


def _prepared(image: ImageFile.ImageFile, kind: str, max_side: int) -> PreparedImage:
    from PIL import Image

    width, height = image.size
    if width < MIN_SIDE_PX or height < MIN_SIDE_PX:
        raise ImageRefused("it has no pixels")
    limit = MAX_JPEG_PIXELS if kind == "JPEG" else MAX_FULL_DECODE_PIXELS
    if width * height > limit:
        raise ImageRefused(
            f"it has {width}×{height} pixels, over the {limit / 1e6:.0f} megapixels images are decoded at"
        )
    target = _fit(width, height, max_side)
    if kind == "JPEG":
        image.draft("RGB", target)  # decodes at 1/2, 1/4 or 1/8 scale while that still covers the target
    image.load()  # the first frame only, for an animation
    frame: Image.Image = image
    if frame.mode in ("RGBA", "LA", "PA") or (frame.mode == "P" and "transparency" in frame.info):
        rgba = frame.convert("RGBA")
        flat = Image.new("RGB", rgba.size, _BACKGROUND)
        flat.paste(rgba, mask=rgba.getchannel("A"))
        frame = flat
    elif frame.mode != "RGB":
        frame = frame.convert("RGB")
    if frame.size != target:
        # Pillow's bilinear is a triangle filter widened by the scale (antialiased, not point-sampled): after the
        # draft's halving a photo is scaled by less than 2, where it looks as bicubic does at half the time and
        # Lanczos' third (31, 64 and 103 ms on a 12-MP photo; bench: senses). Halving first past twice the target.
        frame = frame.resize(target, Image.Resampling.BILINEAR, reducing_gap=REDUCING_GAP)
    out = io.BytesIO()
    frame.save(out, "JPEG", quality=JPEG_QUALITY)
    return PreparedImage(
        data=out.getvalue(),
        width=target[0],
        height=target[1],
        source_format=_FORMATS[kind],
        source_width=width,
        source_height=height,
    )


def _fit(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The size with the long side at most `max_side`, the aspect kept (never upscaled)."""
    scale = min(1.0, max_side / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def image_size(data: bytes) -> tuple[int, int] | None:
    """The pixel size in an image's header (nothing decoded); None when it is no image PIL reads."""
    from PIL import Image

    kind = sniff_format(data[:16])
    if kind is None:
        return None
    try:
        with Image.open(io.BytesIO(data), formats=[kind]) as image:
            return image.size
    except Exception:  # a header PIL cannot read: no size
        return None


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:120] or type(exc).__name__
