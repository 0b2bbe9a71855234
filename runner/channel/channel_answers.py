"""How the run API says yes and no: a `ChannelAnswer` body with its status, and the refusal the endpoints raise."""

from __future__ import annotations

from aiohttp import web

from container.protocol import ChannelAnswer

INVALID_STATUS = 400  # a refusal that counts towards the run's limit of invalid requests


class ChannelRefused(Exception):
    """The endpoint refuses the request: HTTP status and the reason the container sees. `invalid`: the request
    is one the agent's own loop never sends, and counts towards the run's limit (by default a 400 does)."""

    def __init__(self, status: int, reason: str, *, invalid: bool | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.invalid = status == INVALID_STATUS if invalid is None else invalid


def answer(status: int, ok: bool, detail: str) -> web.Response:
    return web.Response(
        status=status, body=ChannelAnswer(ok=ok, detail=detail).model_dump_json(), content_type="application/json"
    )
