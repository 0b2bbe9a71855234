"""Posted images made ready for the model: downscaled and re-encoded, and every kind of bad image refused with a
reason instead of decoded (the issue's "Bad input" list)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from PIL import Image

from bot.senses.image_prep import (
    MAX_SIDE_PX,
    ImageRefused,
    image_size,
    prepare_image,
    sniff_format,
)
from tests.bot.senses.media import animated_webp, gif, jpeg, png, png_bomb, zip_file


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_a_twelve_megapixel_photo_is_downscaled_to_the_long_side_and_sent_as_jpeg() -> None:
    prepared = prepare_image(jpeg(4000, 3000))
    assert (prepared.width, prepared.height) == (MAX_SIDE_PX, 1176)
    assert (prepared.source_width, prepared.source_height, prepared.source_format) == (4000, 3000, "JPEG")
    sent = decoded(prepared.data)
    assert (sent.format, sent.size, sent.mode) == ("JPEG", (1568, 1176), "RGB")
    assert prepared.media_type == "image/jpeg"


def test_a_small_image_is_never_upscaled_and_transparency_goes_on_white() -> None:
    prepared = prepare_image(png(300, 200, mode="RGBA"))
    assert (prepared.width, prepared.height, prepared.source_format) == (300, 200, "PNG")
    pixel = decoded(prepared.data).getpixel((10, 10))
    assert isinstance(pixel, tuple)
    # (20, 120, 200) at half opacity over white, within JPEG's error.
    assert all(abs(got - want) <= 6 for got, want in zip(pixel, (137, 187, 227), strict=True))


def test_a_tall_screenshot_keeps_its_aspect() -> None:
    prepared = prepare_image(png(1080, 2400))
    assert (prepared.width, prepared.height) == (706, MAX_SIDE_PX)


def test_a_gif_gives_its_first_frame() -> None:
    prepared = prepare_image(gif(frames=3))
    assert (prepared.width, prepared.height, prepared.source_format) == (40, 30, "GIF")


def test_an_animated_webp_of_a_thousand_frames_gives_its_first_frame() -> None:
    data = animated_webp(1_000)
    prepared = prepare_image(data)
    assert (prepared.width, prepared.height, prepared.source_format) == (64, 64, "WebP")
    assert decoded(prepared.data).getpixel((5, 5))[0] < 20  # type: ignore[index]  # frame 0 is the dark one


def test_a_png_declaring_fifty_thousand_pixels_square_is_refused_undecoded() -> None:
    bomb = png_bomb(50_000, 50_000)
    assert len(bomb) < 200 * 1024
    with pytest.raises(ImageRefused, match=r"more pixels|megapixels"):
        prepare_image(bomb)


def test_a_png_over_the_full_decode_limit_is_refused_by_its_header() -> None:
    with pytest.raises(ImageRefused, match=r"5000×5000 pixels, over the 17 megapixels"):
        prepare_image(png_bomb(5_000, 5_000))


def test_a_truncated_jpeg_is_refused_not_shown_half_grey() -> None:
    data = jpeg(1200, 900)
    with pytest.raises(ImageRefused, match="cannot be decoded"):
        prepare_image(data[: len(data) // 2])


def test_a_zip_posing_as_an_image_is_refused_by_its_bytes() -> None:
    with pytest.raises(ImageRefused, match="not a PNG, JPEG, WebP or GIF"):
        prepare_image(zip_file())
    assert sniff_format(zip_file()) is None
    assert image_size(zip_file()) is None


@pytest.mark.parametrize("data", [b"", b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, b"GIF89a" + b"\xff" * 10])
def test_headers_without_an_image_are_refused(data: bytes) -> None:
    with pytest.raises(ImageRefused):
        prepare_image(data)


def test_a_started_bot_has_not_imported_pillow() -> None:
    """Pillow is loaded by the first image (75 ms, 3 MiB), not at start."""
    probe = (
        "import importlib, sys\n"
        "for name in ('crewbot.app', 'bot.channels.telegram', 'runner.service'): importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'PIL'))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
