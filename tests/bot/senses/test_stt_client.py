"""The speech-to-text call against a fake OpenAI-compatible service on 127.0.0.1: what it sends, and a service
that fails, floods or hangs failing the call with a reason (never a hang of the bot, never a retry)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.senses.stt_client import MAX_REPORTED_SECONDS, MAX_RESPONSE_BYTES, SttClient, SttError
from tests.bot.senses.media import ogg_opus
from tests.fakes.stt_server import FakeStt

VOICE = ogg_opus(3.0)


@pytest.fixture
async def stt() -> AsyncIterator[FakeStt]:
    async with FakeStt() as fake:
        yield fake


async def test_the_audio_goes_as_multipart_with_the_model_language_and_key(stt: FakeStt) -> None:
    stt.answer("hello there", seconds=3.0)
    client = SttClient(stt.base_url + "/", "whisper-1", api_key="sk-stt", language="en")
    try:
        heard = await client.transcribe(VOICE, "audio.ogg", "audio/ogg")
    finally:
        await client.close()
    assert (heard.text, heard.seconds) == ("hello there", 3.0)
    (call,) = stt.calls
    assert call.fields == {"model": "whisper-1", "response_format": "json", "language": "en"}
    assert (call.file_name, call.file_type, call.data) == ("audio.ogg", "audio/ogg", VOICE)
    assert call.authorization == "Bearer sk-stt"


async def test_without_a_key_no_authorization_is_sent(stt: FakeStt) -> None:
    stt.answer("hi")
    client = SttClient(stt.base_url, "whisper-large-v3")
    try:
        assert (await client.transcribe(VOICE, "audio.ogg", "audio/ogg")).seconds is None
    finally:
        await client.close()
    assert stt.calls[0].authorization is None and "language" not in stt.calls[0].fields


async def test_a_500_fails_the_call_with_its_status_only(stt: FakeStt) -> None:
    stt.fail(500, "the GPU caught fire")
    client = SttClient(stt.base_url, "whisper-1")
    try:
        with pytest.raises(SttError) as failed:
            await client.transcribe(VOICE, "audio.ogg", "audio/ogg")
    finally:
        await client.close()
    assert len(stt.calls) == 1  # no retry
    assert str(failed.value) == "the speech-to-text service answered 500 (Internal Server Error)"
    assert failed.value.billed  # the audio went up: it may be billed


async def test_a_401_quoting_the_key_leaves_the_key_out_of_the_reason(stt: FakeStt) -> None:
    stt.reject_key()
    client = SttClient(stt.base_url, "whisper-1", api_key="sk-stt-secret")
    try:
        with pytest.raises(SttError) as failed:
            await client.transcribe(VOICE, "audio.ogg", "audio/ogg")
    finally:
        await client.close()
    assert str(failed.value) == "the speech-to-text service answered 401 (Unauthorized)"
    assert not failed.value.billed  # refused: nothing to count


@pytest.mark.parametrize(
    "body",
    [
        b'{"text": "hi", "duration": 1e400}',  # no float holds it: inf
        b'{"text": "hi", "usage": {"seconds": 1e400}}',
        b'{"text": "hi", "duration": NaN}',
        b'{"text": "hi", "duration": 86401}',  # over a day: no voice note's length
    ],
)
async def test_a_duration_over_a_day_is_the_most_a_call_counts_never_unknown(stt: FakeStt, body: bytes) -> None:
    stt.raw(body)
    client = SttClient(stt.base_url, "whisper-1")
    try:
        heard = await client.transcribe(VOICE, "audio.ogg", "audio/ogg")
    finally:
        await client.close()
    assert (heard.text, heard.seconds, heard.over_a_day) == ("hi", MAX_REPORTED_SECONDS, True)


@pytest.mark.parametrize("body", [b'{"text": "hi", "duration": true}', b'{"text": "hi", "duration": -5}'])
async def test_a_duration_that_is_no_number_of_seconds_is_none_said(stt: FakeStt, body: bytes) -> None:
    stt.raw(body)
    client = SttClient(stt.base_url, "whisper-1")
    try:
        heard = await client.transcribe(VOICE, "audio.ogg", "audio/ogg")
    finally:
        await client.close()
    assert (heard.text, heard.seconds, heard.over_a_day) == ("hi", None, False)


async def test_a_megabyte_of_text_is_refused_as_it_arrives(stt: FakeStt) -> None:
    stt.flood(1024 * 1024)
    client = SttClient(stt.base_url, "whisper-1")
    try:
        with pytest.raises(SttError, match=f"more than {MAX_RESPONSE_BYTES // 1024} KB"):
            await client.transcribe(VOICE, "audio.ogg", "audio/ogg")
    finally:
        await client.close()


async def test_a_service_that_hangs_fails_the_call_at_its_time_limit(stt: FakeStt) -> None:
    stt.hang()
    client = SttClient(stt.base_url, "whisper-1", timeout_seconds=0.5)
    try:
        with pytest.raises(SttError, match=r"did not answer within 0\.5 s"):
            await client.transcribe(VOICE, "audio.ogg", "audio/ogg")
    finally:
        await client.close()


async def test_a_service_that_is_not_there_fails_the_call() -> None:
    client = SttClient("http://127.0.0.1:9/v1", "whisper-1", timeout_seconds=5)
    try:
        with pytest.raises(SttError, match="could not be reached") as failed:
            await client.transcribe(VOICE, "audio.ogg", "audio/ogg")
    finally:
        await client.close()
    assert not failed.value.billed  # nothing went up
