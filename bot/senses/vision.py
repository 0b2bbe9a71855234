"""Which posted files are images the model may be shown, whether the configured model takes images
(LLM_VISION), and what an image costs by each provider's rule (the spend allowances hold it before the call)."""

from __future__ import annotations

import math
from typing import Any

from core.setting_senses import VisionMode
from core.store.chat_files import ChatFile, FileKind

IMAGE_MIME_TYPES = frozenset({"image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif"})
# Model families known to take no images (LLM_VISION=auto leaves them text-only); a name matching none of these
# is trusted to what pydantic-ai's profile of it says.
TEXT_ONLY_MODELS = (
    "gpt-3.5",
    "gpt-4-0613",
    "gpt-4-32k",
    "o1-mini",
    "o3-mini",
    "deepseek-chat",
    "deepseek-reasoner",
    "deepseek-r1",
    "deepseek-v3",
    "mistral-7b",
    "mixtral",
    "qwen2.5-coder",
    "codestral",
    "claude-2",
    "claude-instant",
    "claude-3-5-haiku",
)
# Anthropic: about width × height / 750 tokens (after its own resizing, which a 1,568 px long side avoids).
ANTHROPIC_PIXELS_PER_TOKEN = 750
# OpenAI, high detail: 85 tokens plus 170 a 512-px tile, after fitting 2,048 px and a short side of 768 px;
# gpt-4o-mini bills the same image at 2,833 + 5,667 a tile. Patch-billed models (gpt-4.1-mini, o4-mini, …):
# 32-px patches, at most 1,536, times up to 2.46.
OPENAI_BASE_TOKENS, OPENAI_TILE_TOKENS = 85, 170
OPENAI_MINI_BASE_TOKENS, OPENAI_MINI_TILE_TOKENS = 2_833, 5_667
OPENAI_TILE_PX, OPENAI_FIT_PX, OPENAI_SHORT_PX = 512, 2_048, 768
OPENAI_PATCH_PX, OPENAI_MAX_PATCHES, OPENAI_PATCH_MULTIPLIER = 32, 1_536, 2.46


def is_image_file(file: ChatFile) -> bool:
    """A photo, a still sticker, or a document of an image type the model may be shown (the bytes decide later)."""
    if file.kind is FileKind.PHOTO:
        return True
    mime = (file.mime_type or "").lower()
    if file.kind is FileKind.STICKER:
        return mime == "image/webp"  # an animated (.tgs) or video (.webm) sticker has no still image
    return file.kind is FileKind.DOCUMENT and mime in IMAGE_MIME_TYPES


def model_takes_images(model: Any) -> bool:
    """LLM_VISION=auto's answer for a pydantic-ai model: its profile's word, unless its name is known text-only.
    The offline demo model says what it was shown, so it takes them."""
    name = str(getattr(model, "model_name", "") or "").lower()
    if any(family in name for family in TEXT_ONLY_MODELS):
        return False
    profile = getattr(model, "profile", None)
    return bool(profile.get("supports_image_input", True)) if isinstance(profile, dict) else True


def vision_on(mode: VisionMode, model: Any) -> bool:
    if mode is VisionMode.OFF:
        return False
    return mode is VisionMode.ON or model_takes_images(model)


def image_tokens(system: str, model_name: str, width: int, height: int) -> int:
    """What an image of this size may be billed, an upper bound for the provider (`system`: pydantic-ai's name of
    it); an unknown provider is held at the most of the known rules."""
    anthropic = math.ceil(width * height / ANTHROPIC_PIXELS_PER_TOKEN)
    openai = max(_openai_tiles(width, height, model_name), _openai_patches(width, height))
    if system == "anthropic":
        return anthropic
    if system == "openai":
        return openai
    return max(anthropic, openai)


def _openai_tiles(width: int, height: int, model_name: str) -> int:
    scale = min(1.0, OPENAI_FIT_PX / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, OPENAI_SHORT_PX / min(w, h))
    w, h = w * scale, h * scale
    tiles = math.ceil(w / OPENAI_TILE_PX) * math.ceil(h / OPENAI_TILE_PX)
    if "4o-mini" in model_name.lower():
        return OPENAI_MINI_BASE_TOKENS + OPENAI_MINI_TILE_TOKENS * tiles
    return OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * tiles


def _openai_patches(width: int, height: int) -> int:
    patches = math.ceil(width / OPENAI_PATCH_PX) * math.ceil(height / OPENAI_PATCH_PX)
    return math.ceil(min(patches, OPENAI_MAX_PATCHES) * OPENAI_PATCH_MULTIPLIER)
