"""A file upload's body as aiohttp's multipart reader sees it, within bounds the host sets before it reads.

aiohttp's reader finds the first boundary by reading the preamble one line at a time, on the event loop: a
preamble of bare line feeds costs one `readline()` a byte (about a second of the loop a megabyte). The
container's client (container/channel_files.py) sends none: the body begins with its boundary, its parts'
headers are a few lines, and nothing follows the closing boundary. So the body is read here with those
rules: the first line must be the boundary (read at most that long), the lines read in all are counted
and capped, each at most MAX_LINE_BYTES, and a line after the closing boundary must be the end of the body.
Whatever breaks a rule raises ChannelRefused (invalid, counted against the run) at once, unread beyond. The
bytes read in all are at most the declared Content-Length: the HTTP parser ends the body there, and nothing is
decompressed (runner/channel/request_framing.py refuses a Content-Encoding).
"""

from __future__ import annotations

import warnings
from typing import cast

from aiohttp import MultipartReader, StreamReader, web
from aiohttp.helpers import parse_mimetype
from aiohttp.http_exceptions import LineTooLong

from runner.channel.channel_answers import INVALID_STATUS, ChannelRefused

# A valid upload reads 13 lines: the opening boundary, each part's headers and the blank line after them, the
# CRLF before each next boundary, the closing boundary and the end. A few more for part headers a client adds.
MAX_UPLOAD_LINES = 24
# Our longest line is a part's Content-Disposition with a 255-byte UTF-8 name twice (plain and percent-encoded):
# about 1,100 bytes. aiohttp's header parser takes seconds of loop time on some long lines (8,000 `;`: 58 ms).
MAX_LINE_BYTES = 2 * 1024
CRLF = b"\r\n"


def bounded_multipart(request: web.Request) -> MultipartReader:
    """aiohttp's reader over the request's body, read within the rules above."""
    boundary = parse_mimetype(request.headers.get("Content-Type", "")).parameters.get("boundary", "")
    if not boundary:
        raise ChannelRefused(INVALID_STATUS, "not a valid file upload: multipart/form-data with a boundary expected")
    body = BoundedMultipartBody(request.content, ("--" + boundary).encode(errors="replace"), MAX_UPLOAD_LINES)
    # The reader takes a StreamReader; it uses only the methods BoundedMultipartBody has.
    return MultipartReader(request.headers, cast(StreamReader, body))


def _refused(reason: str) -> ChannelRefused:
    return ChannelRefused(INVALID_STATUS, f"not a valid file upload: {reason}")


class BoundedMultipartBody:
    """The methods of aiohttp's StreamReader that its multipart reader calls, with the rules above."""

    __slots__ = ("_closed", "_content", "_delimiter", "_lines", "_max_lines")

    def __init__(self, content: StreamReader, delimiter: bytes, max_lines: int) -> None:
        self._content = content
        self._delimiter = delimiter  # `--` and the boundary
        self._max_lines = max_lines
        self._lines = 0
        self._closed = False  # the closing boundary was read

    async def readline(self, *, max_line_length: int | None = None) -> bytes:
        self._lines += 1
        if self._lines > self._max_lines:
            raise _refused(f"over {self._max_lines} lines outside its parts")
        if self._lines == 1:
            opening = self._delimiter + CRLF
            # At most the opening's length: a long first line is refused without being read.
            line = await self._read_line(len(opening), "it must begin with its boundary (no preamble)")
            if line != opening:
                raise _refused("it must begin with its boundary (no preamble)")
            return line
        limit = min(max_line_length or MAX_LINE_BYTES, MAX_LINE_BYTES)
        line = await self._read_line(limit, f"a line over {limit} bytes")
        if self._closed and line not in (b"", CRLF):
            raise _refused("nothing may follow its closing boundary")
        if line.rstrip(CRLF) == self._delimiter + b"--":
            self._closed = True
        return line

    async def _read_line(self, max_bytes: int | None, too_long: str) -> bytes:
        try:
            return await self._content.readline(max_line_length=max_bytes)
        except LineTooLong:
            raise _refused(too_long) from None  # aiohttp's own message would echo the line

    async def read(self, n: int = -1) -> bytes:
        return await self._content.read(n)

    def at_eof(self) -> bool:
        return self._content.at_eof()

    def unread_data(self, data: bytes) -> None:
        # The part reader hands back what it read past a boundary; aiohttp itself silences this deprecation.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            self._content.unread_data(data)
