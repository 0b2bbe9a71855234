"""A fake OpenAI-compatible speech-to-text service on 127.0.0.1: `POST /v1/audio/transcriptions` (multipart: file,
model, language, response_format), answering what the test scripted: words (with the audio's duration, as
OpenAI's whisper-1 reports it), an error status, a flood of text, or nothing at all (a hang).

    async with FakeStt() as stt:
        stt.answer("hello there", seconds=3.0)
        ... STT_BASE_URL=stt.base_url ...
        assert stt.calls[0].fields["model"] == "whisper-1"
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from aiohttp import BodyPartReader, web

from tests.fakes.loopback_server import LoopbackServer

TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"


@dataclass(frozen=True)
class SttCall:
    fields: dict[str, str]
    file_name: str | None
    file_type: str | None
    data: bytes
    authorization: str | None
    seconds_taken: float  # from the request's arrival to its answer (the service's own time)


@dataclass
class _Script:
    text: str = ""
    seconds: float | None = None
    status: int = 200
    body: bytes | None = None  # sent as is, instead of the JSON answer
    hang: bool = False
    delay_seconds: float = 0.0
    echo_key: bool = False  # the error message quotes the Authorization header, as some servers' 401s do


class FakeStt(LoopbackServer):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[SttCall] = []
        self.active = 0
        self.most_active = 0  # the most calls it held at once
        self._script = _Script()
        self._release = asyncio.Event()
        self._called = asyncio.Condition()

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def answer(self, text: str, seconds: float | None = None, *, delay_seconds: float = 0.0) -> None:
        self._script = _Script(text=text, seconds=seconds, delay_seconds=delay_seconds)

    def fail(self, status: int, message: str = "server error") -> None:
        self._script = _Script(status=status, body=json.dumps({"error": {"message": message}}).encode())

    def reject_key(self) -> None:
        """401, quoting the key it was sent in its message."""
        self._script = _Script(status=401, echo_key=True)

    def raw(self, body: bytes) -> None:
        """200 with this body as its JSON (e.g. a `duration` no float holds)."""
        self._script = _Script(body=body)

    def flood(self, size_bytes: int) -> None:
        self._script = _Script(body=json.dumps({"text": "a" * size_bytes}).encode())

    def hang(self) -> None:
        self._script = _Script(hang=True)

    async def wait_for_calls(self, count: int, timeout_seconds: float = 10.0) -> None:
        """Until the service has answered `count` calls (in the test's loop: `async with FakeStt()`)."""
        async with asyncio.timeout(timeout_seconds), self._called:
            await self._called.wait_for(lambda: len(self.calls) >= count)

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(TRANSCRIPTIONS_PATH, self._transcribe)
        return app

    def _on_closing(self) -> None:
        self._release.set()

    async def _transcribe(self, request: web.Request) -> web.StreamResponse:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            return await self._answer(request)
        finally:
            self.active -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        fields: dict[str, str] = {}
        file_name = file_type = None
        data = b""
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "file":
                file_name, file_type = part.filename, part.headers.get("Content-Type")
                data = bytes(await part.read())
            elif part.name:
                fields[part.name] = await part.text()
        script = self._script
        if script.hang:
            await self._release.wait()
        if script.delay_seconds:
            await asyncio.sleep(script.delay_seconds)
        self.calls.append(
            SttCall(
                fields, file_name, file_type, data, request.headers.get("Authorization"), time.monotonic() - started
            )
        )
        async with self._called:
            self._called.notify_all()
        if script.echo_key:
            message = f"Incorrect API key provided: {request.headers.get('Authorization', '')}"
            return web.json_response({"error": {"message": message}}, status=script.status)
        if script.body is not None:
            return web.Response(status=script.status, body=script.body, content_type="application/json")
        answer: dict[str, object] = {"text": script.text}
        if script.seconds is not None:
            answer["usage"] = {"type": "duration", "seconds": script.seconds}
        return web.json_response(answer)
