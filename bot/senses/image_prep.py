"""An image posted in a chat, made ready for the model: decoded with limits, downscaled to at most MAX_SIDE_PX on
its long side and re-encoded as a JPEG. Blocking and CPU-bound: run it in a thread (bot/senses/seen_images.py).

Posted images are hostile input. Only PNG, JPEG, WebP and GIF are opened, chosen by their bytes (a ZIP named
`photo.png` is refused unread). The size in the header decides before any pixel is decoded: a JPEG is decoded
at a reduced scale (`draft`: the decoder's DCT scaling, up to 1/8 a side) so a 12-megapixel photo never needs its
full 36 MB of pixels, unless it is progressive or has several scans (libjpeg then keeps every coefficient, 2
bytes a pixel a channel, whatever the scale); those and other formats, which have no such scaling, are bounded
by MAX_FULL_DECODE_PIXELS (WebP, whose decoder copies more, by MAX_WEBP_PIXELS). The image is reduced before
anything else is made of it (its transparency flattened on the small copy), then turned upright by its EXIF.
An animation gives its first frame only (the others are never decoded). A truncated file fails to decode and is
refused, never shown half grey.

Pillow is imported on the first image, not at start (75 ms and 3 MiB a bot with no images never pays).
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image, ImageFile

MAX_SIDE_PX = 1_568  # the long side sent: Anthropic's largest without its own resizing, OpenAI's high detail fits it
JPEG_QUALITY = 85
REDUCING_GAP = 2.0
# A baseline JPEG decoded at 1/8 a side from this many pixels is 1.4 MP (4 MB of RGB) at most. Pillow's own bomb
# limit (Image.MAX_IMAGE_PIXELS, which it checks first) is the same, so neither refuses before the other.
MAX_JPEG_PIXELS = 89_478_485
# Formats decoded at full size (PNG, GIF, WebP) and JPEGs that keep every coefficient until the last scan
# (progressive or multi-scan: libjpeg holds 2 bytes a pixel a channel whatever the draft scale): about 64 MiB
# (70 measured) of a decode at most, the resized copy made before its transparency is flattened included.
MAX_FULL_DECODE_PIXELS = 5_000_000
# libwebp decodes into its own buffer and Pillow copies it out: about 3 times a PNG's bytes a pixel.
MAX_WEBP_PIXELS = 2_000_000
RGB_CHANNELS = 3  # what MAX_FULL_DECODE_PIXELS is set for: a JPEG of more channels (CMYK) gets fewer pixels
MAX_JPEG_SEGMENTS = 256  # markers walked to the image's end (a real file has a dozen or so, and one scan)
MIN_SIDE_PX = 1
_FORMATS = {"JPEG": "JPEG", "PNG": "PNG", "WEBP": "WebP", "GIF": "GIF"}
_BACKGROUND = (255, 255, 255)  # transparency (stickers, screenshots with alpha) is shown on white
_ORIENTATION_TAG = 0x0112  # EXIF: how the camera was held
_SOS, _EOI, _SOI, _RST0, _TEM = 0xDA, 0xD9, 0xD8, 0xD0, 0x01  # JPEG markers (the byte after FF)
# In entropy-coded data a marker is FF followed by neither 00 (a stuffed FF), a restart (D0-D7), nor FF (fill).
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


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
    limit = _pixel_limit(image, kind)
    if width * height > limit:
        raise ImageRefused(
            f"it has {width}×{height} pixels, over the {limit / 1e6:.1f} megapixels images like it are decoded at"
        )
    target = _fit(width, height, max_side)
    if kind == "JPEG":
        image.draft("RGB", target)  # decodes at 1/2, 1/4 or 1/8 scale while that still covers the target
    turn = _turn(image)
    image.load()  # the first frame only, for an animation
    frame: Image.Image = image
    alpha = frame.mode in ("RGBA", "LA", "PA") or (frame.mode == "P" and "transparency" in frame.info)
    if alpha and frame.mode != "RGBA":
        frame = frame.convert("RGBA")
    elif frame.mode in ("1", "P"):
        frame = frame.convert("RGB")  # Pillow resizes these point-sampled: their colours first
    if frame.size != target:
        # Reduced before anything else is made of it, so no other full-size copy is ever held (an RGBA image is
        # resized with its colours premultiplied, as its transparency needs). Pillow's bilinear is a triangle
        # filter widened by the scale (antialiased, not point-sampled): after the draft's halving a photo is
        # scaled by less than 2, where it looks as bicubic does at half the time and Lanczos' third (31, 64 and
        # 103 ms on a 12-MP photo; bench: senses). Halving first past twice the target.
        frame = frame.resize(target, Image.Resampling.BILINEAR, reducing_gap=REDUCING_GAP)
    if frame.mode == "RGBA":
        flat = Image.new("RGB", frame.size, _BACKGROUND)
        flat.paste(frame, mask=frame.getchannel("A"))
        frame = flat
    elif frame.mode != "RGB":
        frame = frame.convert("RGB")
    if turn is not None:
        frame = frame.transpose(turn)  # upright, as the camera's EXIF says (after the resize: a small copy)
    out = io.BytesIO()
    frame.save(out, "JPEG", quality=JPEG_QUALITY)
    return PreparedImage(
        data=out.getvalue(),
        width=frame.width,
        height=frame.height,
        source_format=_FORMATS[kind],
        source_width=width,
        source_height=height,
    )


def _pixel_limit(image: ImageFile.ImageFile, kind: str) -> int:
    """The most pixels this image is decoded with: a JPEG's by how its decoder holds it, the rest by format."""
    if kind == "WEBP":
        return MAX_WEBP_PIXELS
    if kind != "JPEG":
        return MAX_FULL_DECODE_PIXELS
    fp = getattr(image, "fp", None)
    data = fp.getvalue() if isinstance(fp, io.BytesIO) else b""
    if image.info.get("progressive") or image.info.get("progression") or _multi_scan(data):
        return MAX_FULL_DECODE_PIXELS * RGB_CHANNELS // max(1, len(image.getbands()))
    return MAX_JPEG_PIXELS


def _multi_scan(data: bytes) -> bool:
    """Whether a JPEG's image has more than one scan (a baseline file can: libjpeg then buffers every
    coefficient, as for a progressive one). Its segments are walked by their lengths as a decoder walks them
    (a comment holding the bytes FF D9 is no end); after each start of scan the entropy-coded data is skipped to
    the next real marker; the scans are counted until the end of the image (what follows it, e.g. an appended
    depth map, is not this image)."""
    at, scans = 2, 0
    for _ in range(MAX_JPEG_SEGMENTS):
        while at < len(data) and data[at] != 0xFF:
            at += 1  # tolerate stray bytes between segments, as libjpeg does
        while at + 1 < len(data) and data[at + 1] == 0xFF:
            at += 1  # fill bytes
        if at + 2 > len(data):
            return False  # cut short before its end: what was seen
        marker = data[at + 1]
        if marker == _EOI:
            return False
        if _RST0 <= marker <= _SOI or marker == _TEM:
            at += 2  # a marker without a length
            continue
        if at + 4 > len(data):
            return False
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
        if marker == _SOS:
            scans += 1
            if scans > 1:
                return True
            found = _NEXT_MARKER.search(data, at)  # past the scan's data: FF 00 is a data byte, FF D0-D7 a restart
            if found is None:
                return False
            at = found.start()
    return True  # more segments than any real file: held as the costlier kind


def _turn(image: ImageFile.ImageFile) -> Image.Transpose | None:
    """The transpose that makes the image upright by its EXIF orientation; None when it is upright already."""
    from PIL import Image

    try:
        orientation = image.getexif().get(_ORIENTATION_TAG)
    except Exception:  # a broken EXIF block is no orientation
        return None
    return (
        {
            2: Image.Transpose.FLIP_LEFT_RIGHT,
            3: Image.Transpose.ROTATE_180,
            4: Image.Transpose.FLIP_TOP_BOTTOM,
            5: Image.Transpose.TRANSPOSE,
            6: Image.Transpose.ROTATE_270,
            7: Image.Transpose.TRANSVERSE,
            8: Image.Transpose.ROTATE_90,
        }.get(orientation)
        if isinstance(orientation, int)
        else None
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
