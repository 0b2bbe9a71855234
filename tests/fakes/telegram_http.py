"""The HTTP side of the fake Bot API: a request's parameters in, a Bot API shaped answer out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.telegram_params import ApiError, Params, bad_request
from tests.fakes.telegram_state import JsonDict

TRUNCATED_CONTENT_TYPE = "application/octet-stream"


@dataclass(frozen=True)
class UploadedFile:
    """A multipart file part, as recorded in ApiCall.params."""

    filename: str
    content_type: str
    data: bytes


def chat_param(params: Params) -> int | None:
    """The numeric chat_id of a request, if it has one (an @username has none)."""
    try:
        return params.integer("chat_id")
    except ApiError:
        return None


def answer(body: JsonDict, status: int) -> web.Response:
    return web.json_response(body, status=status)


async def read_params(request: web.Request) -> dict[str, Any]:
    """Query string, then the body: JSON, form-encoded or multipart (files become UploadedFile)."""
    params: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except ValueError:
            raise bad_request("can't parse JSON object") from None
        if not isinstance(body, dict):
            raise bad_request("JSON object expected")
        params.update(body)
    elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        try:
            form = await request.post()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, "Request Entity Too Large") from None
        for key, value in form.items():
            if isinstance(value, web.FileField):
                with value.file:
                    params[key] = UploadedFile(value.filename, value.content_type or "", value.file.read())
            else:
                params[key] = value.decode() if isinstance(value, bytes) else value
    return params


async def serve_truncated(
    request: web.Request, body: bytes, sent_bytes: int | None, *, status: int = 200, content_type: str = ""
) -> web.StreamResponse:
    """The full Content-Length, then only the first `sent_bytes` of the body (default half), then the
    connection closes: the client sees a body cut short."""
    response = web.StreamResponse(status=status)
    response.content_type = content_type or TRUNCATED_CONTENT_TYPE
    response.content_length = len(body)
    await response.prepare(request)
    cut = len(body) // 2 if sent_bytes is None else min(sent_bytes, max(len(body) - 1, 0))
    if cut:
        await response.write(body[:cut])
    if request.transport is not None:
        request.transport.close()  # after what was written has gone out
    return response
