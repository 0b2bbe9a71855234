"""What the bot sees and hears (LLM_VISION, VISION_*, STT_*): images to the main agent and voice to text
(bot/senses/). `Settings` takes these fields from `SenseSettings`, and the streamed replies' from `StreamSettings`
below it."""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field, SecretStr, field_validator

from core.setting_stream import StreamSettings

# ISO-639-1 or -2 (2 or 3 ASCII letters), a region after a dash: en, yue, pt-BR.
LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}(?:-[A-Za-z]{2}|-[0-9]{3})?")
MAX_VISION_IMAGES = 10  # images one prompt may carry: each is up to ~1,600 tokens, decoded on the host
MIN_STT_MAX_SECONDS = 1
MAX_STT_MAX_SECONDS = 4 * 3600  # a 25 MB upload (OpenAI's limit) holds about that much speech at low bitrates
MAX_STT_PRICE_PER_MINUTE = 100.0  # money per minute of audio: above every provider's price list


class VisionMode(StrEnum):
    AUTO = "auto"  # by the model's known capability (crewbot doctor says what it found)
    ON = "on"
    OFF = "off"


class SenseSettings(StreamSettings):
    llm_vision: VisionMode = Field(default=VisionMode.AUTO, alias="LLM_VISION")
    vision_max_images: int = Field(default=3, ge=0, le=MAX_VISION_IMAGES, alias="VISION_MAX_IMAGES")
    # Speech to text: any OpenAI-compatible API base (`{STT_BASE_URL}/audio/transcriptions`); none: off.
    stt_base_url: str | None = Field(default=None, alias="STT_BASE_URL")
    stt_api_key: SecretStr | None = Field(default=None, alias="STT_API_KEY")
    stt_model: str = Field(default="whisper-1", min_length=1, max_length=200, alias="STT_MODEL")
    stt_max_seconds: int = Field(default=300, ge=MIN_STT_MAX_SECONDS, le=MAX_STT_MAX_SECONDS, alias="STT_MAX_SECONDS")
    stt_language: str | None = Field(default=None, max_length=16, alias="STT_LANGUAGE")
    stt_price_per_minute: float = Field(
        default=0.0, ge=0, le=MAX_STT_PRICE_PER_MINUTE, allow_inf_nan=False, alias="STT_PRICE_PER_MINUTE"
    )

    @field_validator("stt_base_url", "stt_api_key", "stt_language", mode="before")
    @classmethod
    def _blank_sense_is_none(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip() or None
        return value

    @field_validator("stt_base_url")
    @classmethod
    def _check_stt_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        import httpx  # as the client will read it (loaded by the bot anyway)

        example = "e.g. https://api.openai.com/v1"
        try:
            url = httpx.URL(value)
        except (httpx.InvalidURL, ValueError):
            raise ValueError(f"is not a URL, {example}") from None
        if url.scheme not in ("http", "https") or not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, {example}")
        if not url.host:
            raise ValueError(f"has no host, {example}")
        if url.query or url.fragment or "?" in value or "#" in value:
            raise ValueError(f"must be the API base alone, no ?query or #fragment (the path is added to it), {example}")
        return value.rstrip("/")

    @field_validator("stt_language")
    @classmethod
    def _check_language(cls, value: str | None) -> str | None:
        if value is not None and not LANGUAGE_CODE.fullmatch(value):
            raise ValueError("must be a language code such as en, de or pt-BR (ISO-639), or empty")
        return value
