"""Images reach the main agent through real PTB and the fake Bot API: a photo, an image document or a sticker in
the turn's window is downloaded once, prepared, sent with the prompt in each provider's request format and
marked in its line; bad images are refused with a reason in their line, never sent."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models import override_allow_model_requests
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bot.agent.offline import prompt_text
from tests.bot.senses.media import animated_webp, jpeg, png, png_bomb, zip_file
from tests.fakes.llm_server import FakeLLM, anthropic_text, openai_text
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

SDK_WAIT_SECONDS = 60.0


class SeeingModel:
    """A FunctionModel that keeps each request's prompt text and images."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.images: list[list[BinaryContent]] = []
        self.labels: list[list[str]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.prompts.append(prompt_text(messages))
        parts = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, UserPromptPart)]
        content: list[Any] = [] if isinstance(parts[-1].content, str) else list(parts[-1].content)
        self.images.append([item for item in content if isinstance(item, BinaryContent)])
        self.labels.append([item for item in content[1:] if isinstance(item, str)])
        return ModelResponse(parts=[TextPart("I see it")])

    def model(self) -> FunctionModel:
        return FunctionModel(self, model_name="gpt-4o")


def size_of(content: BinaryContent) -> tuple[int, int]:
    with Image.open(io.BytesIO(content.data)) as image:
        assert image.format == "JPEG"
        return image.size


async def test_a_photo_is_shown_to_the_model_downloaded_once(tmp_path: Path) -> None:
    seeing = SeeingModel()
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg), model=seeing.model()) as app:
        update = tg.push_media_message(
            GROUP_ID, "photo", jpeg(2400, 1800), caption=f"@{tg.bot_username} what's wrong here?"
        )
        await tg.wait_for_messages(GROUP_ID, 1)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} and now?")
        await tg.wait_for_messages(GROUP_ID, 2)
        await app.wait_quiet(GROUP_ID)
    largest = update["message"]["photo"][-1]
    assert [size_of(image) for turn in seeing.images for image in turn] == [(1568, 1176), (1568, 1176)]
    assert seeing.labels[0] == ["[image 1: f1]"]
    assert "[file f1: photo_" in seeing.prompts[0] and "(shown to you as image 1, 1568×1176)" in seeing.prompts[0]
    assert len(tg.downloads(largest["file_id"])) == 1  # the second turn used the prepared copy
    assert len(list((tmp_path / "files" / "seen").glob("*.jpg"))) == 1


async def test_only_the_newest_images_are_shown_and_stickers_and_documents_count(tmp_path: Path) -> None:
    seeing = SeeingModel()
    settings = make_settings(tmp_path, None, VISION_MAX_IMAGES=2)
    async with (
        FakeTelegram() as tg,
        telegram_app(make_settings(tmp_path, tg, VISION_MAX_IMAGES=2), model=seeing.model()),
    ):
        assert settings.vision_max_images == 2
        tg.push_media_message(GROUP_ID, "photo", png(300, 200))
        tg.push_media_message(GROUP_ID, "document", png(64, 48), file_name="chart.png")
        tg.push_media_message(GROUP_ID, "sticker", animated_webp(1, side=128))
        tg.push_message(GROUP_ID, f"@{tg.bot_username} what do you see?")
        await tg.wait_for_messages(GROUP_ID, 1)
    (images,) = seeing.images
    assert [size_of(image) for image in images] == [(64, 48), (128, 128)]
    prompt = seeing.prompts[0]
    assert "chart.png, image/png, " in prompt and "(shown to you as image 1, 64×48)" in prompt
    assert "[file f3: sticker_" in prompt and "(shown to you as image 2, 128×128)" in prompt
    assert "image 3" not in prompt and prompt.count("shown to you") == 2


async def test_vision_off_sends_no_image(tmp_path: Path) -> None:
    seeing = SeeingModel()
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg, LLM_VISION="off"), model=seeing.model()):
        tg.push_media_message(GROUP_ID, "photo", png(300, 200), caption=f"@{tg.bot_username} look")
        await tg.wait_for_messages(GROUP_ID, 1)
        assert tg.downloads() == []
    assert seeing.images == [[]] and "shown to you" not in seeing.prompts[0]


@pytest.mark.parametrize(
    ("data", "name", "mime", "reason"),
    [
        (png_bomb(), "huge.png", "image/png", "it declares more pixels than an image is decoded with"),
        (jpeg(1200, 900)[:20_000], "cut.jpg", "image/jpeg", "it cannot be decoded (image file is truncated"),
        (zip_file(), "photo.png", "image/png", "it is not a PNG, JPEG, WebP or GIF image"),
        (b"\xff\xd8\xff" + b"\x00" * (20 * 1024 * 1024), "big.jpg", "image/jpeg", "it has 20.0 MB, over the 10.0 MB"),
    ],
)
async def test_bad_images_are_refused_with_their_reason_in_their_line(
    tmp_path: Path, data: bytes, name: str, mime: str, reason: str
) -> None:
    seeing = SeeingModel()
    async with FakeTelegram() as tg, telegram_app(make_settings(tmp_path, tg), model=seeing.model()) as app:
        update = tg.push_media_message(GROUP_ID, "document", data, file_name=name, mime_type=mime)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} what is it?")
        await tg.wait_for_messages(GROUP_ID, 1)
        tg.push_message(GROUP_ID, f"@{tg.bot_username} again?")
        await tg.wait_for_messages(GROUP_ID, 2)
        await app.wait_quiet(GROUP_ID)
    assert seeing.images == [[], []]
    for prompt in seeing.prompts:
        assert f"(image not shown to you: {reason}" in prompt
    downloads = tg.downloads(update["message"]["document"]["file_id"])
    assert len(downloads) == (0 if len(data) > 10 * 1024 * 1024 else 1)  # refused once, remembered


@pytest.mark.parametrize(("provider", "streamed"), [("openai", False), ("openai", True), ("anthropic", False)])
async def test_each_providers_request_carries_the_image(tmp_path: Path, provider: str, streamed: bool) -> None:
    async with FakeLLM(api_key="sk-image") as llm, FakeTelegram() as tg:
        llm.openai.enqueue(openai_text("a red square"))
        llm.anthropic.enqueue(anthropic_text("a red square"))
        base = llm.base_url if provider == "openai" else llm.anthropic_base_url
        settings = make_settings(
            tmp_path,
            tg,
            LLM_PROVIDER=provider,
            LLM_BASE_URL=base,
            LLM_API_KEY="sk-image",
            LLM_MODEL="gpt-4o" if provider == "openai" else "claude-3-5-sonnet-latest",  # auto: takes images
            STREAM_REPLIES=str(streamed).lower(),  # a streamed answer's request carries it too (streamed_turn.py)
        )
        with override_allow_model_requests(True):
            async with telegram_app(settings):
                tg.push_media_message(GROUP_ID, "photo", png(120, 80), caption=f"@{tg.bot_username} what is it?")
                # The first turn imports the provider's SDK (Anthropic's: seconds on a busy machine).
                (sent,) = await tg.wait_for_messages(GROUP_ID, 1, timeout_seconds=SDK_WAIT_SECONDS)
        path = "/v1/chat/completions" if provider == "openai" else "/v1/messages"
        (request,) = llm.requests(path)
    assert sent.plain_text.startswith("Crew: a red square") or streamed
    assert bool(request.body.get("stream")) is streamed
    content = request.body["messages"][-1]["content"]
    if provider == "openai":
        assert [part["type"] for part in content] == ["text", "text", "image_url"]
        assert content[1]["text"] == "[image 1: f1]"
        url = content[2]["image_url"]["url"]
        assert url.startswith("data:image/jpeg;base64,")
        data = base64.b64decode(url.partition(",")[2])
    else:
        assert [part["type"] for part in content][:3] == ["text", "text", "image"]
        source = content[2]["source"]
        assert (source["type"], source["media_type"]) == ("base64", "image/jpeg")
        data = base64.b64decode(source["data"])
    with Image.open(io.BytesIO(data)) as image:
        assert (image.format, image.size) == ("JPEG", (120, 80))
