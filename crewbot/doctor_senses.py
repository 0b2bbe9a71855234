"""`crewbot doctor`'s senses: whether the main agent's model is shown images (LLM_VISION, and in `auto` what is
known of the model), and whether the speech-to-text service transcribes (a one-second silent clip sent to it)."""

from __future__ import annotations

import asyncio
import struct

from bot.senses.stt_client import SttClient, SttError
from bot.senses.vision import vision_on
from core.setting_senses import VisionMode
from core.settings import Settings
from crewbot.doctor_result import CheckResult, fail
from crewbot.senses import stt_client

CHECK_TIMEOUT_SECONDS = 20.0
SILENCE_RATE_HZ = 16_000
STT_FIX = (
    "check STT_BASE_URL (the API base: the bot POSTs {STT_BASE_URL}/audio/transcriptions), STT_API_KEY and STT_MODEL"
)


def silent_wav(seconds: float = 1.0, rate: int = SILENCE_RATE_HZ) -> bytes:
    """A WAV of silence (16-bit mono): what the check sends, so no one's words leave the machine."""
    data = b"\x00\x00" * int(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    head = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
    return head + b"data" + struct.pack("<I", len(data)) + data


async def check_vision(settings: Settings) -> CheckResult:
    mode = settings.llm_vision
    if mode is VisionMode.OFF:
        return CheckResult("skip", "LLM_VISION=off: images are not shown to the model")
    from bot.agent.main_agent import build_main_model

    model = await asyncio.to_thread(build_main_model, settings)
    name = model.model_name
    if not vision_on(mode, model):
        return CheckResult(
            "ok", f"images are not shown: {name} is not known to take them (LLM_VISION=on shows them anyway)"
        )
    why = "LLM_VISION=on" if mode is VisionMode.ON else f"LLM_VISION=auto: {name} takes images"
    return CheckResult("ok", f"images are shown to the model ({why}; the newest {settings.vision_max_images})")


async def check_stt(settings: Settings, timeout_seconds: float = CHECK_TIMEOUT_SECONDS) -> CheckResult:
    client = stt_client(settings)
    if client is None:
        return CheckResult("skip", "STT_BASE_URL is not set: voice notes, audio and video notes are not transcribed")
    await client.close()
    key = settings.stt_api_key.get_secret_value() if settings.stt_api_key is not None else None
    probe = SttClient(
        client.url.removesuffix("/audio/transcriptions"),
        settings.stt_model,
        api_key=key,
        language=settings.stt_language,
        timeout_seconds=timeout_seconds,
    )
    try:
        heard = await probe.transcribe(silent_wav(), "silence.wav", "audio/wav")
    except SttError as exc:
        said = f": {exc.detail}" if exc.detail else ""  # the doctor's output is redacted (secrets_of)
        return fail(f"POST {probe.url} with a second of silence: {exc}{said}", STT_FIX)
    finally:
        await probe.close()
    words = f'heard "{heard.text[:40]}"' if heard.text else "heard nothing, as it should"
    return CheckResult("ok", f"{probe.url} transcribes (model {settings.stt_model}; a second of silence: {words})")
