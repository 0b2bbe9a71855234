"""A Bot API request's parameters and the fake's error answers, shared by its methods and its HTTP side."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tests.fakes.telegram_state import JsonDict


class ApiError(Exception):
    """A Bot API error answer: HTTP status = error_code."""

    def __init__(self, status: int, description: str, parameters: JsonDict | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters

    def body(self) -> JsonDict:
        body: JsonDict = {"ok": False, "error_code": self.status, "description": self.description}
        if self.parameters:
            body["parameters"] = self.parameters
        return body


def bad_request(reason: str) -> ApiError:
    return ApiError(400, f"Bad Request: {reason}")


class Params:
    """Typed reads of request parameters: form values arrive as strings, JSON bodies keep types."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = dict(raw)

    def string(self, name: str) -> str | None:
        value = self.raw.get(name)
        if value is None or isinstance(value, str):
            return value
        return json.dumps(value) if isinstance(value, dict | list | bool) else str(value)

    def integer(self, name: str) -> int | None:
        value = self.raw.get(name)
        if value is None or value == "":
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return int(str(value).strip())
        except ValueError:
            raise bad_request(f"invalid {name} specified") from None

    def number(self, name: str) -> float | None:
        value = self.raw.get(name)
        if value is None or value == "":
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise bad_request(f"invalid {name} specified") from None

    def flag(self, name: str) -> bool:
        value = self.raw.get(name)
        if isinstance(value, str):
            return value.strip().lower() in ("true", "1")
        return bool(value)

    def json(self, name: str) -> Any:
        """A nested object: a JSON string in forms (how PTB sends it), native in JSON bodies."""
        value = self.raw.get(name)
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except ValueError:
            raise bad_request(f"can't parse {name} JSON object") from None


Handler = Callable[[Params], Awaitable[Any]]
