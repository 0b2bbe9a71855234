"""JSON from a container, measured before it is built.

A run's body is written by an LLM following strangers' instructions. Parsing and validating it holds the
GIL for as long as the body has values (8 MB of `{}` is 2.8 million objects: seconds of the host's
time, gigabytes of memory and millions of validation errors). So every body is first measured as it
arrives, 64 KB at a time, with byte-level scans that build nothing: how many values, how deeply nested.
A body over the caps is refused at the first piece that shows it (the rest is never read); only a body
within them is parsed, so the work is bounded by the caps and not by the body's size. Refusals echo none
of the body.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic_core
from aiohttp import web
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)

# Within one piece of the body, each pass strips at least one level of nesting; across pieces the open
# brackets are carried. A body up to this deep always passes; one twice as deep never does. Real bodies (a
# conversation, a tool's schema) are under 15 levels.
MAX_DEPTH_PASSES = 32
SCAN_PIECE_BYTES = 64 * 1024  # each scan of a piece is tens of microseconds: the loop is never held long
# Reading every error of a body full of mistakes costs more than validating it: past this many, only the count.
MAX_ERRORS_SHOWN = 16
MAX_LOCATION_CHARS = 100
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in _BRACKETS)
_CLOSES = {ord("]"): ord("["), ord("}"): ord("{")}


class BodyRefused(ValueError):
    """The body is over a cap or not what it should be; the message says which, without echoing it."""


class BodyTooLarge(Exception):
    """The body is over its byte limit (declared so, or shown by its bytes)."""


class ShapeScanner:
    """Counts a JSON body's values and nesting as it arrives, piece by piece, and refuses it (BodyRefused) as
    soon as it is over the caps: a body of millions of `{}` is refused after its first piece, unread beyond.

    Values are over-counted, never under: a value is the first of its container or comes after a comma,
    and every container is one. In JSON a backslash always escapes the one character after it, so dropping
    escaped backslashes, then escaped quotes, leaves exactly the quotes that open and close strings (UTF-8
    never holds these bytes inside a longer character); what lies outside strings is the structure counted."""

    def __init__(self, max_values: int) -> None:
        self._max_values = max_values
        self._values = 1
        self._quotes = 0
        self._in_string = False
        self._held = b""  # a piece's odd last backslash: what it escapes is in the next piece
        self._open = bytearray()  # the brackets still open, outermost first

    def feed(self, piece: bytes) -> None:
        data = self._held + piece if self._held else piece
        # A trailing run of backslashes pairs up from its start; only an odd last one escapes what the next
        # piece begins with, so at most one byte is ever held back (never a growing run to copy again).
        trailing = len(data) - len(data.rstrip(b"\\"))
        kept = data[: len(data) - trailing % 2]
        self._held = data[len(kept) :]
        unescaped = kept.replace(b"\\\\", b"").replace(b'\\"', b"")
        quotes = unescaped.count(b'"')
        self._quotes += quotes
        # Every string is a value or the key of one, and has two quotes: at most four per value.
        if self._quotes > 4 * self._max_values + 4:
            raise self._over()
        if quotes:
            pieces = unescaped.split(b'"')
            structure = b"".join(pieces[1::2] if self._in_string else pieces[0::2])
            self._in_string ^= quotes % 2 == 1
        else:
            structure = b"" if self._in_string else unescaped
        self._values += structure.count(b",") + structure.count(b"[") + structure.count(b"{")
        if self._values > self._max_values:
            raise self._over()
        self._nest(structure.translate(None, _NOT_BRACKETS))

    def finish(self) -> None:
        if self._held or self._in_string:
            raise BodyRefused("not JSON: a string is not closed")
        if self._open:
            raise BodyRefused("not JSON: its brackets do not match")

    def _over(self) -> BodyRefused:
        return BodyRefused(f"over the limit of {self._max_values} JSON values")

    def _nest(self, brackets: bytes) -> None:
        for _ in range(MAX_DEPTH_PASSES):
            stripped = brackets.replace(b"[]", b"").replace(b"{}", b"")
            if stripped == brackets:
                break
            brackets = stripped
        else:
            if b"[]" in brackets or b"{}" in brackets:
                raise BodyRefused(f"nested more than {MAX_DEPTH_PASSES} levels deep")
        # What is left closes brackets opened before this piece, then opens new ones.
        for position, byte in enumerate(brackets):
            opener = _CLOSES.get(byte)
            if opener is None:
                self._open += brackets[position:]
                break
            if not self._open or self._open.pop() != opener:
                raise BodyRefused("not JSON: its brackets do not match")
        if len(self._open) > MAX_DEPTH_PASSES:
            raise BodyRefused(f"nested more than {MAX_DEPTH_PASSES} levels deep")


async def read_measured(request: web.Request, limit: int, max_values: int) -> bytes:
    """The body, measured as it arrives: BodyTooLarge past `limit` bytes (a declared length past it: unread),
    BodyRefused at the first piece that shows it over `max_values` or nested too deeply, unread beyond."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge
    scanner = ShapeScanner(max_values)
    chunks: list[bytes] = []
    size = 0
    while True:
        # At most one byte past the limit: that byte is how a body longer than its declared length shows itself.
        chunk = await request.content.read(min(SCAN_PIECE_BYTES, limit + 1 - size))
        if not chunk:
            scanner.finish()
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        scanner.feed(chunk)
        chunks.append(chunk)


def check_shape(body: bytes, max_values: int) -> None:
    """BodyRefused when `body` holds more than `max_values` JSON values or is nested too deeply."""
    scanner = ShapeScanner(max_values)
    view = memoryview(body)
    for start in range(0, len(body), SCAN_PIECE_BYTES):
        scanner.feed(bytes(view[start : start + SCAN_PIECE_BYTES]))
    scanner.finish()


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
