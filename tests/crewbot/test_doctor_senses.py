"""`crewbot doctor` on the senses: whether the model is shown images, and the speech-to-text service checked with
a second of silence (a failure says what was tried and how to fix it; the key never shows)."""

from __future__ import annotations

from pathlib import Path

from bot.senses.audio_sniff import audio_format, audio_seconds
from core.logging import SecretRedactor
from crewbot.doctor_result import render
from crewbot.doctor_senses import check_stt, check_vision, silent_wav
from crewbot.startup import secrets_of
from tests.fakes.stt_server import FakeStt
from tests.harness import make_settings


async def test_a_working_service_is_sent_one_second_of_silence(tmp_path: Path) -> None:
    async with FakeStt() as stt:
        stt.answer("", seconds=1.0)
        url = f"{stt.base_url}/audio/transcriptions"
        result = await check_stt(make_settings(tmp_path, STT_BASE_URL=stt.base_url, STT_API_KEY="sk-stt-doctor"))
    assert result.status == "ok"
    assert result.detail == f"{url} transcribes (model whisper-1; a second of silence: heard nothing, as it should)"
    (call,) = stt.calls
    assert audio_format(call.data) == "wav" and audio_seconds(call.data) == 1.0 and call.data == silent_wav()
    assert call.authorization == "Bearer sk-stt-doctor"


async def test_a_failing_or_hanging_service_fails_with_its_fix(tmp_path: Path) -> None:
    async with FakeStt() as stt:
        stt.fail(401, "Incorrect API key provided")
        refused = await check_stt(make_settings(tmp_path, STT_BASE_URL=stt.base_url, STT_API_KEY="sk-wrong"))
        stt.hang()
        hung = await check_stt(make_settings(tmp_path, STT_BASE_URL=stt.base_url), timeout_seconds=0.5)
    assert refused.status == "FAIL" and "answered 401 (Unauthorized): Incorrect API key provided" in refused.detail
    assert refused.fix is not None and "STT_BASE_URL" in refused.fix and "sk-wrong" not in refused.detail
    assert hung.status == "FAIL" and "did not answer within 0.5 s" in hung.detail


async def test_a_service_quoting_the_key_in_its_401_never_shows_it(tmp_path: Path) -> None:
    key = "sk-stt-very-secret-123456"
    async with FakeStt() as stt:
        stt.reject_key()
        settings = make_settings(tmp_path, STT_BASE_URL=stt.base_url, STT_API_KEY=key)
        result = await check_stt(settings)
    line = SecretRedactor(secrets_of(settings)).scrub(render("speech", result))
    assert result.status == "FAIL" and "Incorrect API key provided" in line and key not in line


async def test_without_stt_the_check_is_skipped_and_vision_follows_the_model(tmp_path: Path) -> None:
    assert (await check_stt(make_settings(tmp_path))).status == "skip"
    offline = await check_vision(make_settings(tmp_path))
    assert offline.status == "ok" and "images are shown to the model (LLM_VISION=auto" in offline.detail
    text_only = make_settings(
        tmp_path, LLM_PROVIDER="openai", LLM_BASE_URL="http://127.0.0.1:9/v1", LLM_MODEL="gpt-3.5-turbo"
    )
    assert "images are not shown: gpt-3.5-turbo is not known to take them" in (await check_vision(text_only)).detail
    assert (await check_vision(make_settings(tmp_path, LLM_VISION="off"))).status == "skip"
