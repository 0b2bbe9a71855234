"""LLM_VISION against a provider on 127.0.0.1: in `auto` a model of no known vision family is sent no images (an
OpenAI-compatible base serving llama3.1:8b would refuse every turn with a photo in its window), and a provider
that refuses a request's images gets the turn again without them, once; no images for that model after only when
it says the model takes none (a content policy's refusal costs only its turn)."""

from __future__ import annotations

from pathlib import Path

from pydantic_ai.models import override_allow_model_requests

from tests.bot.senses.media import png
from tests.fakes.faults import Fault
from tests.fakes.llm_server import FakeLLM, openai_text
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import GROUP_ID, make_settings, telegram_app

SDK_WAIT_SECONDS = 60.0
PATH = "/v1/chat/completions"


def _has_image(body: dict[str, object]) -> bool:
    messages = body["messages"]
    assert isinstance(messages, list)
    content = messages[-1]["content"]
    return isinstance(content, list) and any(part.get("type") == "image_url" for part in content)


async def test_auto_sends_no_image_to_a_model_of_no_known_vision_family(tmp_path: Path) -> None:
    async with FakeLLM(api_key="sk-x") as llm, FakeTelegram() as tg:
        llm.openai.enqueue(openai_text("no eyes here"))
        settings = make_settings(
            tmp_path, tg, LLM_PROVIDER="openai", LLM_BASE_URL=llm.base_url, LLM_API_KEY="sk-x", LLM_MODEL="llama3.1:8b"
        )
        with override_allow_model_requests(True):
            async with telegram_app(settings):
                tg.push_media_message(GROUP_ID, "photo", png(120, 80), caption=f"@{tg.bot_username} what is it?")
                await tg.wait_for_messages(GROUP_ID, 1, timeout_seconds=SDK_WAIT_SECONDS)
        (request,) = llm.requests(PATH)
    assert not _has_image(request.body)


async def test_a_provider_refusing_images_gets_the_turn_again_without_them_and_none_after(tmp_path: Path) -> None:
    async with FakeLLM(api_key="sk-x") as llm, FakeTelegram() as tg:
        llm.fail_next(Fault.error(400, "image input is not supported for this model"))
        llm.openai.enqueue(openai_text("answered without it"))
        llm.openai.enqueue(openai_text("still without it"))
        settings = make_settings(
            tmp_path,
            tg,
            LLM_PROVIDER="openai",
            LLM_BASE_URL=llm.base_url,
            LLM_API_KEY="sk-x",
            LLM_MODEL="my-local-model",
            LLM_VISION="on",
        )
        with override_allow_model_requests(True):
            async with telegram_app(settings):
                tg.push_media_message(GROUP_ID, "photo", png(120, 80), caption=f"@{tg.bot_username} what is it?")
                (first,) = await tg.wait_for_messages(GROUP_ID, 1, timeout_seconds=SDK_WAIT_SECONDS)
                tg.push_message(GROUP_ID, f"@{tg.bot_username} and now?")
                replies = await tg.wait_for_messages(GROUP_ID, 2)
        requests = llm.requests(PATH)
    assert "answered without it" in first.plain_text and "still without it" in replies[-1].plain_text
    assert [_has_image(r.body) for r in requests] == [True, False, False]


async def test_a_content_policy_refusal_costs_only_its_turn(tmp_path: Path) -> None:
    async with FakeLLM(api_key="sk-x") as llm, FakeTelegram() as tg:
        llm.fail_next(Fault.error(400, "Your request was rejected by the safety system: image content not allowed"))
        llm.openai.enqueue(openai_text("answered without it"))
        llm.openai.enqueue(openai_text("this one I see"))
        settings = make_settings(
            tmp_path,
            tg,
            LLM_PROVIDER="openai",
            LLM_BASE_URL=llm.base_url,
            LLM_API_KEY="sk-x",
            LLM_MODEL="gpt-4o",
            LLM_VISION="on",
        )
        with override_allow_model_requests(True):
            async with telegram_app(settings):
                tg.push_media_message(GROUP_ID, "photo", png(120, 80), caption=f"@{tg.bot_username} what is it?")
                (first,) = await tg.wait_for_messages(GROUP_ID, 1, timeout_seconds=SDK_WAIT_SECONDS)
                tg.push_media_message(GROUP_ID, "photo", png(90, 60), caption=f"@{tg.bot_username} and this one?")
                replies = await tg.wait_for_messages(GROUP_ID, 2)
        requests = llm.requests(PATH)
    assert "answered without it" in first.plain_text and "this one I see" in replies[-1].plain_text
    assert [_has_image(r.body) for r in requests] == [True, False, True]  # the next turn is shown images again
