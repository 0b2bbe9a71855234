"""The workspace download as `unpack` (container/workspace_tar.py) hands it to tarfile: counted, read forward only,
and bounded where tarfile would hold it in memory.

tarfile reads a member's headers (a pax header, a GNU long name, a sparse map) whole into memory, whatever size
they declare, and its stream mode copies them twice more: one 64 MB name cost a pod about 190 MB. So unpack
does not use the stream mode: it opens tarfile on a `TarSource`, a file that seeks only forward (by reading)
and that refuses, before reading a byte, any read past MAX_MEMBER_HEADER_BYTES while one member's headers are
read (`TarSource.headers`). Reads of a file's data, and the skipping of data, are not bounded by it.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import tarfile
from collections.abc import Iterator
from typing import Protocol

FILE_READ_BYTES = 1024 * 1024
# Bytes read from the download at a time for tarfile's small reads (one 512-byte header each).
STREAM_BUFFER_BYTES = 256 * 1024
# One member's headers in all: pack writes at most a 4096-byte name and a 4096-byte link target in a pax header
# (about 9 KB with its ustar blocks); twice that leaves room, and caps what a hostile archive makes tarfile hold.
MAX_MEMBER_HEADER_BYTES = 16 * 1024


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


class DownloadCut(ConnectionError):
    """The download broke off: the channel tries it again (unlike a local file's error, LocalFileFailed)."""


class ArchiveRefused(tarfile.ReadError):
    """The archive is past a bound that unpack keeps (a member's headers, the number of members): no archive
    that pack made is, so it is refused whole, as one that is not a tar stream is."""


class StreamBody:
    """A download, counted: it ends at `length` bytes, and a body that ends before, or a connection that fails,
    raises DownloadCut."""

    def __init__(self, source: Readable, length: int) -> None:
        self._source = source
        self._left = length

    def read(self, size: int, /) -> bytes:
        try:
            chunk = self._source.read(min(size, self._left)) if self._left else b""
        except (OSError, http.client.HTTPException) as exc:
            raise DownloadCut(f"the workspace download broke off: {exc}") from exc
        if not chunk and self._left:
            raise DownloadCut(f"the workspace download ended {self._left} bytes early")
        self._left -= len(chunk)
        return chunk

    def drain(self) -> None:
        """Read what follows the archive's end (padding), so that the whole body is known to have arrived."""
        while self.read(FILE_READ_BYTES):
            pass


class TarSource:
    """`body` as tarfile reads a file: `read` returns all it asks for but at the end, `seek` only goes forward."""

    def __init__(self, body: StreamBody) -> None:
        self._body = body
        self._buffer = b""
        self._start = 0  # where the unread part of `_buffer` begins
        self._position = 0
        self._header_left: int | None = None  # while a member's headers are read: what they may still read

    @contextlib.contextmanager
    def headers(self) -> Iterator[None]:
        """While tarfile reads one member's headers (`TarFile.next`): at most MAX_MEMBER_HEADER_BYTES of reads."""
        self._header_left = MAX_MEMBER_HEADER_BYTES
        try:
            yield
        finally:
            self._header_left = None

    def read(self, size: int, /) -> bytes:
        if size < 0:
            raise ValueError("tarfile reads a stream by sizes")
        if self._header_left is not None:
            if size > self._header_left:
                raise ArchiveRefused(
                    f"a member's headers are over {MAX_MEMBER_HEADER_BYTES} bytes (a name, link or sparse map "
                    "longer than any file's)"
                )
            self._header_left -= size
        data = self._take(size)
        self._position += len(data)
        return data

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET, /) -> int:
        if whence != os.SEEK_SET or offset < self._position:
            raise ArchiveRefused("the archive asks to be read backwards: its headers are inconsistent")
        while self._position < offset:  # skipped data is read and dropped, never held
            skipped = self._take(min(offset - self._position, STREAM_BUFFER_BYTES))
            if not skipped:
                raise tarfile.ReadError("unexpected end of data")
            self._position += len(skipped)
        return self._position

    def drain(self) -> None:
        self._body.drain()

    def write(self, data: bytes, /) -> int:
        raise OSError(errno.EBADF, "a download is read only")

    def close(self) -> None:
        return None

    def _take(self, size: int) -> bytes:
        """Up to `size` bytes: fewer only at the end of the download."""
        pieces: list[bytes] = []
        left = size
        while left:
            if self._start == len(self._buffer):
                if left >= STREAM_BUFFER_BYTES:  # a file's data: straight from the download
                    chunk = self._body.read(left)
                    if not chunk:
                        break
                    pieces.append(chunk)
                    left -= len(chunk)
                    continue
                self._buffer, self._start = self._body.read(STREAM_BUFFER_BYTES), 0
                if not self._buffer:
                    break
            piece = self._buffer[self._start : self._start + left]
            self._start += len(piece)
            left -= len(piece)
            pieces.append(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)
