"""Which files are images the model is shown, which models take them (LLM_VISION=auto), and what each provider
may bill for one (the allowances hold it before the call)."""

from __future__ import annotations

import pytest
from pydantic_ai.messages import BinaryContent, ModelRequest, UserPromptPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.test import TestModel

from bot.agent.metered import request_image_tokens
from bot.senses.image_prep import prepare_image
from bot.senses.vision import (
    CHATS_TO_MARK,
    ImageRefusals,
    image_tokens,
    is_image_file,
    model_takes_images,
    refuses_images,
    takes_no_images,
    vision_on,
)
from core.setting_senses import VisionMode
from core.store.chat_files import ChatFile, FileKind
from tests.bot.senses.media import jpeg


def file(kind: FileKind, mime: str | None) -> ChatFile:
    return ChatFile(1, 1, 1, kind, "id", "uid", "x", mime, 10, 0.0)


@pytest.mark.parametrize(
    ("kind", "mime", "image"),
    [
        (FileKind.PHOTO, "image/jpeg", True),
        (FileKind.DOCUMENT, "image/png", True),
        (FileKind.DOCUMENT, "image/gif", True),
        (FileKind.DOCUMENT, "image/svg+xml", False),
        (FileKind.DOCUMENT, "application/zip", False),
        (FileKind.STICKER, "image/webp", True),
        (FileKind.STICKER, "application/x-tgsticker", False),
        (FileKind.STICKER, "video/webm", False),
        (FileKind.ANIMATION, "video/mp4", False),
        (FileKind.VOICE, "audio/ogg", False),
    ],
)
def test_images_are_photos_still_stickers_and_image_documents(kind: FileKind, mime: str, image: bool) -> None:
    assert is_image_file(file(kind, mime)) is image


def test_auto_follows_the_model_off_and_on_do_not() -> None:
    text_only = TestModel(model_name="gpt-3.5-turbo")
    seeing = TestModel(model_name="gpt-4o")
    assert not model_takes_images(text_only) and model_takes_images(seeing)
    assert vision_on(VisionMode.AUTO, seeing) and not vision_on(VisionMode.AUTO, text_only)
    assert vision_on(VisionMode.ON, text_only) and not vision_on(VisionMode.OFF, seeing)
    assert model_takes_images(FunctionModel(lambda m, i: None, model_name="crewbot-offline"))  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize(
    ("name", "takes"),
    [
        ("gpt-4o-mini", True),
        ("gpt-4.1", True),
        ("gpt-5", True),
        ("o3", True),
        ("o4-mini", True),
        ("claude-3-5-sonnet-latest", True),
        ("claude-sonnet-4-5", True),
        ("gemini-2.0-flash", True),
        ("llava:13b", True),
        ("qwen2.5-vl-7b-instruct", True),
        ("pixtral-12b", True),
        ("llama3.1:8b", False),  # pydantic-ai's profile says yes to these: auto does not trust it
        ("qwen2.5:7b", False),
        ("mistral-large", False),
        ("o3-mini", False),
        ("claude-3-5-haiku", False),
        ("gpt-3.5-turbo", False),
    ],
)
def test_auto_shows_images_only_to_known_vision_families(name: str, takes: bool) -> None:
    assert model_takes_images(TestModel(model_name=name)) is takes


def test_a_model_whose_provider_refused_images_is_sent_none_again() -> None:
    model = TestModel(model_name="gpt-4o")
    assert not vision_on(VisionMode.AUTO, model, {"gpt-4o"}) and not vision_on(VisionMode.ON, model, {"gpt-4o"})

    class Refused(Exception):
        def __init__(self, status_code: int, body: object) -> None:
            super().__init__(f"status_code: {status_code}")
            self.status_code, self.body = status_code, body

    assert refuses_images(Refused(400, {"error": {"message": "image input is not supported"}}))
    assert not refuses_images(Refused(400, {"error": {"message": "context length exceeded"}}))
    assert not refuses_images(Refused(500, {"error": {"message": "image decoder crashed"}}))


class Refused(Exception):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"status_code: {status_code}")
        self.status_code, self.body = status_code, {"error": {"message": message}}


POLICY = Refused(400, "Your request was rejected by our safety system: the image may contain disallowed content")
TEXT_ONLY = Refused(400, "This model does not support image input")


@pytest.mark.parametrize(
    "message",
    [
        "image input is not supported for this model",
        "This model does not support image input",
        "Invalid content type. image_url is only supported by certain models.",
        "llava is a vision model; qwen2.5 is not a vision model",
    ],
)
def test_a_text_only_models_refusal_says_so(message: str) -> None:
    assert takes_no_images(Refused(400, message))


def test_a_content_policy_or_a_bad_image_is_no_text_only_model() -> None:
    assert refuses_images(POLICY) and not takes_no_images(POLICY)
    assert not takes_no_images(Refused(400, "image too large: at most 20 MB"))


def test_one_refusal_about_an_image_costs_its_turn_only_a_repeat_in_another_chat_marks_the_model() -> None:
    refusals = ImageRefusals()
    assert not refusals.refused("gpt-4o", -1, POLICY)
    assert not refusals.refused("gpt-4o", -1, POLICY)  # the same chat again: still only its images
    assert refusals.refusing == set()
    assert CHATS_TO_MARK == 2 and refusals.refused("gpt-4o", -2, POLICY)  # a second chat: the model, surely
    assert refusals.refused("local", -1, TEXT_ONLY) and refusals.refusing == {"gpt-4o", "local"}  # said: at once


def test_each_providers_rule_for_a_prepared_photo() -> None:
    # 1568 x 1176: Anthropic ~ w*h/750; OpenAI high detail: 1024x768 after its fitting = 4 tiles.
    assert image_tokens("anthropic", "claude-sonnet-4", 1568, 1176) == 2459
    # OpenAI: tiles give 85 + 170 * 4 = 765; its patch-billed models up to 1,536 patches * 2.46 = 3,779.
    assert image_tokens("openai", "gpt-4o", 1568, 1176) == 3779
    assert image_tokens("openai", "gpt-4o-mini", 1568, 1176) == 2833 + 5667 * 4
    unknown = image_tokens("function", "crewbot-offline", 1568, 1176)
    assert unknown >= image_tokens("anthropic", "x", 1568, 1176) and unknown >= image_tokens(
        "openai", "gpt-4o", 1568, 1176
    )
    assert image_tokens("anthropic", "x", 100, 100) == 14  # a small sticker costs little


def test_a_requests_images_are_held_by_their_size_not_their_bytes() -> None:
    prepared = prepare_image(jpeg(4000, 3000))
    request = ModelRequest(parts=[UserPromptPart(["look", BinaryContent(prepared.data, media_type="image/jpeg")] * 2)])
    held = request_image_tokens([request], "anthropic", "claude")
    assert held == 2 * image_tokens("anthropic", "claude", 1568, 1176)
    assert held > len(prepared.data) // 100  # far more than a token per 100 bytes would have held
