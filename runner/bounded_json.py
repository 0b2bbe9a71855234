"""JSON from a container, measured before it is built.

A run's body is written by an LLM following strangers' instructions. Parsing and validating it holds the
GIL for as long as the body has values (8 MB of `{}` is 2.8 million objects: seconds of the host's
time, gigabytes of memory and millions of validation errors). So every body is first measured with
byte-level scans (each a C loop over the body, milliseconds for 8 MB, nothing built): how many values
and how deeply nested. Only a body within the caps is parsed, so the work is bounded by the caps and
not by the body's size. Refusals echo none of the body.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)

# Each pass strips at least one level of nesting, so a body up to this deep always passes and one more than
# twice as deep never does. Real bodies (a conversation, a tool's schema) are under 15 levels.
MAX_DEPTH_PASSES = 32
# Reading every error of a body full of mistakes costs more than validating it: past this many, only the count.
MAX_ERRORS_SHOWN = 16
MAX_LOCATION_CHARS = 100
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in _BRACKETS)


class BodyRefused(ValueError):
    """The body is over a cap or not what it should be; the message says which, without echoing it."""


def check_shape(body: bytes, max_values: int) -> None:
    """BodyRefused when `body` holds more than `max_values` JSON values or is nested too deeply. Values are
    over-counted, never under: a scan that cannot see where strings end would let a string hide structure."""
    # In JSON a backslash always escapes the one character after it, so dropping `\\` pairs, then `\"`, leaves
    # exactly the quotes that open and close strings. UTF-8 never holds these bytes inside a longer character.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    quotes = unescaped.count(b'"')
    if quotes % 2:
        raise BodyRefused("not JSON: a string is not closed")
    if quotes > 2 * max_values + 2:  # every string is a value or the key of one
        raise BodyRefused(f"over the limit of {max_values} JSON values")
    structure = b"".join(unescaped.split(b'"')[0::2]) if quotes else unescaped
    # A value is the first of its container, or comes after a comma; every container is a value itself.
    values = structure.count(b",") + structure.count(b"[") + structure.count(b"{") + 1
    if values > max_values:
        raise BodyRefused(f"over the limit of {max_values} JSON values")
    _check_depth(structure.translate(None, _NOT_BRACKETS))


def _check_depth(brackets: bytes) -> None:
    for _ in range(MAX_DEPTH_PASSES):
        if not brackets:
            return
        stripped = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if stripped == brackets:
            raise BodyRefused("not JSON: its brackets do not match")
        brackets = stripped
    if brackets:
        raise BodyRefused(f"nested more than {MAX_DEPTH_PASSES} levels deep")


def load(body: bytes, max_values: int) -> Any:
    """The body's JSON value, once its shape is within the caps; BodyRefused otherwise. Blocking."""
    check_shape(body, max_values)
    try:
        return pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError:
        raise BodyRefused("not JSON") from None


def validate(model: type[ModelT], body: bytes, max_values: int) -> ModelT:
    """The body as `model`, once its shape is within the caps; BodyRefused with the first error otherwise."""
    check_shape(body, max_values)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise BodyRefused(first_error(exc)) from None


def first_error(exc: ValidationError) -> str:
    """Where the first error is and what it says; only a count when there are many (never all of them)."""
    count = exc.error_count()
    if count > MAX_ERRORS_SHOWN:
        return f"{count} errors"
    first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"])[:MAX_LOCATION_CHARS] or "(body)"
    more = f" (and {count - 1} more)" if count > 1 else ""
    return f"{where}: {first['msg']}{more}"
