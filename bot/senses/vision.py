"""Which posted files are images the model may be shown, whether the configured model takes images
(LLM_VISION), and what an image costs by each provider's rule (the spend allowances hold it before the call)."""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import Any

from core.setting_senses import VisionMode
from core.store.chat_files import ChatFile, FileKind

HTTP_BAD_REQUEST = 400
# How providers say a model takes no images at all (OpenAI-compatible servers, vLLM, Ollama, LiteLLM), as opposed
# to refusing one image (a content policy, a size, a format): that marks the model at once.
TEXT_ONLY_SAYING = re.compile(
    r"(?:does not|doesn't|do not|don't|cannot|can't|not) (?:support|accept|take|handle)s? (?:image|vision|multimodal)"
    r"|(?:image|vision|multimodal)(?: input)?s? (?:is|are) not supported|not a (?:vision|multimodal) model"
    r"|image_url is only supported by certain models|unsupported content type:? ?'?image"
)
CHATS_TO_MARK = 2  # different chats whose images a model refused before it is shown none
IMAGE_MIME_TYPES = frozenset({"image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif"})
# LLM_VISION=auto shows images only to a model of a family known to take them (pydantic-ai's profile says yes to
# any name it does not know: llama3.1:8b behind an OpenAI-compatible base would fail every turn with a photo in
# it); LLM_VISION=on shows them to any other. Matched in the lower-cased name, after a provider's prefix.
VISION_MODELS = re.compile(
    r"gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-4-turbo|gpt-4-vision|chatgpt-4o|(?:^|[/:])o[134](?:-|$)"
    r"|claude-3|claude-(?:sonnet|opus|haiku)-4|gemini|gemma-?3|llava|qwen[0-9.]*-?vl|pixtral|llama-?3\.2-vision"
    r"|llama-?4|minicpm-v|moondream|internvl|grok-[0-9.]*-?vision|grok-4|mistral-(?:small|medium)-3"
    r"|crewbot-offline"  # the offline demo model, which says what it was shown
)
# Families known to take no images, though a name above may match them (claude-3-5-haiku, o1-mini).
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


def model_name(model: Any) -> str:
    return str(getattr(model, "model_name", "") or "")


def model_takes_images(model: Any) -> bool:
    """LLM_VISION=auto's answer for a pydantic-ai model: only a known vision family's (VISION_MODELS), not one
    known text-only, and not one whose profile says no."""
    name = model_name(model).lower()
    if any(family in name for family in TEXT_ONLY_MODELS) or not VISION_MODELS.search(name):
        return False
    profile = getattr(model, "profile", None)
    return bool(profile.get("supports_image_input", True)) if isinstance(profile, dict) else True


def vision_on(mode: VisionMode, model: Any, refusing: Collection[str] = ()) -> bool:
    """`refusing`: the models a provider has refused images for since the bot started (never shown them again)."""
    if mode is VisionMode.OFF or model_name(model) in refusing:
        return False
    return mode is VisionMode.ON or model_takes_images(model)


def refuses_images(exc: BaseException) -> bool:
    """Whether a provider's error is its refusal of the request's images (an HTTP 400 that speaks of them: a
    text-only model, or a content policy, a size, a format): the turn is then tried once without them."""
    if getattr(exc, "status_code", None) != HTTP_BAD_REQUEST:
        return False
    said = f"{getattr(exc, 'body', '')} {exc}".lower()
    return "image" in said or "vision" in said


def takes_no_images(exc: BaseException) -> bool:
    """Whether the refusal says the model takes no images at all (not that this image was refused)."""
    return refuses_images(exc) and bool(TEXT_ONLY_SAYING.search(f"{getattr(exc, 'body', '')} {exc}".lower()))


class ImageRefusals:
    """Which models are no longer shown images until the bot restarts. One refusal that may be about the image
    (a content policy, its size) costs only its turn, which is tried again without images: a model is marked
    only when the provider says it takes no images, or refuses images in CHATS_TO_MARK different chats."""

    def __init__(self) -> None:
        self.refusing: set[str] = set()
        self._chats: dict[str, set[int]] = {}  # model -> chats whose images it refused (at most CHATS_TO_MARK)

    def refused(self, model: str, chat_id: int, exc: BaseException) -> bool:
        """Record a refusal; True when the model is now marked as taking no images."""
        chats = self._chats.setdefault(model, set())
        chats.add(chat_id)
        if takes_no_images(exc) or len(chats) >= CHATS_TO_MARK:
            self.refusing.add(model)
            self._chats.pop(model, None)
        return model in self.refusing


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
