"""Files over the run channel, the bytes' part: a download streamed into an open file, an upload streamed from
one as multipart/form-data. `RunChannel.fetch_file` and `send_file` (container/channel.py) use these in the
channel's thread, so no file byte is read or written on the event loop.

Errors of the local file (a full disk, a file that shrank while it was sent) raise `LocalFileFailed`, not an
OSError: the channel takes OSErrors for a host that did not answer and tries again, which would not help.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from container.file_names import safe_file_name

T = TypeVar("T")

CHUNK_BYTES = 256 * 1024
# A download may be a little longer than the size the task offered (a size the host took from Telegram), never
# much longer, and never longer than this whatever the task says.
FETCH_SLACK_BYTES = 64 * 1024
MAX_FETCH_BYTES = 512 * 1024 * 1024
MAX_REASON_BYTES = 64 * 1024  # a refusal's answer: a ChannelAnswer with one line in it
BOUNDARY_BYTES = 16


class LocalFileFailed(Exception):
    """The file in the container could not be written or read; `error` is why."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error))
        self.error = error


class BadBody(Exception):
    """The host's download is not the file it offered: longer, or shorter than it said. Not an OSError: trying
    again would not help."""


def fetch_limit(size_bytes: int) -> int:
    return min(max(size_bytes, 0) + FETCH_SLACK_BYTES, MAX_FETCH_BYTES)


def receive_into(response: http.client.HTTPResponse, fd: int, limit: int) -> int:
    """Write the response's body to `fd` from offset 0 (truncating it first); returns the byte count.

    BadBody past `limit`, or when the body ends before its Content-Length (http.client's read(amt) returns
    short then, without an error)."""
    _local(lambda: os.ftruncate(fd, 0))
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadBody(f"the host offered {declared} bytes, more than the {limit} expected")
    count = 0
    while chunk := response.read(min(CHUNK_BYTES, limit + 1 - count)):
        count += len(chunk)
        if count > limit:
            raise BadBody(f"the host sent more than the {limit} bytes expected")
        _pwrite_all(fd, chunk, count - len(chunk))
    if declared is not None and declared.isdigit() and count != int(declared):
        raise BadBody(f"the download ended after {count} of {declared} bytes")
    return count


@dataclass(frozen=True, slots=True)
class Upload:
    """One file as `POST /run/files` takes it: its headers, and a fresh iterator over its body per attempt."""

    content_type: str
    content_length: int
    head: bytes
    tail: bytes
    size: int

    @classmethod
    def build(cls, meta: dict[str, object], name: str, size: int) -> Upload:
        boundary = f"crewbot-{secrets.token_hex(BOUNDARY_BYTES)}"
        meta_part = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="meta"\r\nContent-Type: application/json\r\n\r\n'
        ).encode() + json.dumps(meta).encode()
        file_head = (
            f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; {_filename_params(name)}\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        head = meta_part + file_head
        tail = f"\r\n--{boundary}--\r\n".encode()
        return cls(
            content_type=f"multipart/form-data; boundary={boundary}",
            content_length=len(head) + size + len(tail),
            head=head,
            tail=tail,
            size=size,
        )

    def headers(self) -> dict[str, str]:
        return {"Content-Type": self.content_type, "Content-Length": str(self.content_length)}

    def body(self, fd: int) -> Iterator[bytes]:
        """The body, the file read from `fd` by offset, so each attempt starts at the file's start.
        Exactly `size` bytes of it: Content-Length is already sent, so a file that shrank fails the upload."""
        yield self.head
        offset = 0
        while offset < self.size:
            try:
                chunk = os.pread(fd, min(CHUNK_BYTES, self.size - offset), offset)
            except OSError as exc:
                raise LocalFileFailed(exc) from exc
            if not chunk:
                raise LocalFileFailed(OSError(0, f"the file shrank to {offset} bytes while it was sent"))
            offset += len(chunk)
            yield chunk
        yield self.tail


def _filename_params(name: str) -> str:
    """`filename="…"` in ASCII a header parser takes; the UTF-8 name as `filename*` too when it has more."""
    safe = safe_file_name(name)
    ascii_name = safe.encode("ascii", "replace").decode().replace("?", "_")
    if ascii_name == safe:
        return f'filename="{safe}"'
    return f"filename=\"{ascii_name}\"; filename*=UTF-8''{urllib.parse.quote(safe, safe='')}"


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    try:
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    except OSError as exc:
        raise LocalFileFailed(exc) from exc


def _local(work: Callable[[], T]) -> T:
    try:
        return work()
    except OSError as exc:
        raise LocalFileFailed(exc) from exc


def receive_or_refusal(response: http.client.HTTPResponse, fd: int, limit: int) -> bytes | int:
    """A download's byte count, or the refusal's answer."""
    if response.status != 200:
        return response.read(MAX_REASON_BYTES)
    return receive_into(response, fd, limit)
