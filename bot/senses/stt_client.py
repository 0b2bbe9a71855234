"""Speech to text over an OpenAI-compatible API: one POST of the audio to `{STT_BASE_URL}/audio/transcriptions`
(multipart: the file, the model, the language if set), the key as a bearer token. The answer is read as it
arrives up to MAX_RESPONSE_BYTES and the whole call is bounded in time: a service that hangs, fails, or answers
with a flood fails this call with a reason, and nothing retries it."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass

import httpx

from core.logging import get_logger

log = get_logger(__name__)

MAX_RESPONSE_BYTES = 256 * 1024  # about four hours of speech as JSON; more is no transcript
DEFAULT_TIMEOUT_SECONDS = 120.0  # the whole call: upload, transcription, answer
CONNECT_TIMEOUT_SECONDS = 10.0
MAX_ERROR_CHARS = 200
# A `duration` beyond a day (or not finite) is no voice note's: the service may bill it, so it is counted as this
# much, the most a call is counted, and its words are not kept (bot/senses/transcriber.py).
MAX_REPORTED_SECONDS = 24 * 3600


class SttError(Exception):
    """The transcription failed: the message says why, in a line for the chat's history (never the service's
    own words, which may echo what was sent, the key included). `billed`: the audio may have reached the
    service, which may charge for it (a timeout, a 5xx, a cut connection), so it is counted."""

    def __init__(self, message: str, *, billed: bool = True, detail: str = "") -> None:
        super().__init__(message)
        self.billed = billed
        self.detail = detail  # the service's own words, for the operator (the doctor, logs: secrets redacted)


@dataclass(frozen=True, slots=True)
class Heard:
    text: str
    seconds: float | None  # the audio's length, when the service said (`duration`, or `usage.seconds`)
    over_a_day: bool = False  # it said more than MAX_REPORTED_SECONDS (`seconds` is then that)


class SttClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        language: str | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self._url = f"{base_url.rstrip('/')}/audio/transcriptions"
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._language = language
        self._timeout_seconds = timeout_seconds
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_seconds, connect=CONNECT_TIMEOUT_SECONDS), follow_redirects=False
        )

    @property
    def url(self) -> str:
        return self._url

    async def close(self) -> None:
        await self._client.aclose()

    async def transcribe(self, data: bytes, file_name: str, mime_type: str) -> Heard:
        fields = {"model": self._model, "response_format": "json"}
        if self._language:
            fields["language"] = self._language
        try:
            async with asyncio.timeout(self._timeout_seconds):
                return await self._post(fields, data, file_name, mime_type)
        except TimeoutError:
            raise SttError(f"the speech-to-text service did not answer within {self._timeout_seconds:g} s") from None
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise SttError(
                f"the speech-to-text service could not be reached ({type(exc).__name__})", billed=False
            ) from None
        except httpx.HTTPError as exc:
            raise SttError(f"the speech-to-text call failed ({type(exc).__name__})") from None

    async def _post(self, fields: dict[str, str], data: bytes, file_name: str, mime_type: str) -> Heard:
        files = {"file": (file_name, data, mime_type)}
        async with self._client.stream("POST", self._url, data=fields, files=files, headers=self._headers) as response:
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > MAX_RESPONSE_BYTES:
                    raise SttError(
                        f"the speech-to-text service answered with more than {MAX_RESPONSE_BYTES // 1024} KB"
                    )
            if response.status_code != httpx.codes.OK:
                # The service's words go to the operator (secrets redacted there), only the status to the chat.
                detail = _short(_message(bytes(body)))
                log.warning("stt_refused", status=response.status_code, message=detail)
                raise SttError(
                    f"the speech-to-text service answered {response.status_code} ({_reason(response.status_code)})",
                    billed=response.status_code >= httpx.codes.INTERNAL_SERVER_ERROR,
                    detail=detail,
                )
            return _heard(bytes(body), response.headers.get("content-type", ""))


def _heard(body: bytes, content_type: str) -> Heard:
    text = body.decode("utf-8", errors="replace")
    if "json" not in content_type and not text.lstrip().startswith("{"):
        return Heard(text.strip(), None)  # response_format=text, as some servers answer whatever was asked
    try:
        found = json.loads(text)
    except ValueError:
        raise SttError("the speech-to-text service's answer is not JSON") from None
    if not isinstance(found, dict) or not isinstance(found.get("text"), str):
        raise SttError("the speech-to-text service's answer has no text")
    seconds = found.get("duration")
    usage = found.get("usage")
    if not isinstance(seconds, int | float) and isinstance(usage, dict):
        seconds = usage.get("seconds")
    said = _seconds(seconds)
    if said is not None and said > MAX_REPORTED_SECONDS:
        return Heard(found["text"].strip(), MAX_REPORTED_SECONDS, over_a_day=True)
    return Heard(found["text"].strip(), said)


def _seconds(value: object) -> float | None:
    """A reported length: a number of seconds (infinite or NaN: more than any), none said for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    if not math.isfinite(seconds):
        return math.inf
    return seconds if seconds >= 0 else None


def _reason(status: int) -> str:
    return httpx.codes.get_reason_phrase(status) or "an unknown status"


def _message(body: bytes) -> str:
    """An error answer's message: OpenAI's `{"error": {"message": …}}`, or the start of whatever it is."""
    text = body[:2048].decode("utf-8", errors="replace")
    try:
        found = json.loads(text)
    except ValueError:
        return text
    error = found.get("error") if isinstance(found, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return text


def _short(text: str) -> str:
    return " ".join(text.split())[:MAX_ERROR_CHARS] or "no reason given"
