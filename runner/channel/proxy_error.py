"""The answer the LLM proxy gives itself, in the provider's error shape: raised by its policy, its budget and
its upstream, and sent by the proxy."""

from __future__ import annotations

from aiohttp import web


class ProxyError(Exception):
    """An answer the proxy gives itself: status, error type and a message the container's client shows."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message

    def response(self) -> web.Response:
        return error_response(self.status, self.error_type, self.message)


def error_response(status: int, error_type: str, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": error_type}}, status=status)
