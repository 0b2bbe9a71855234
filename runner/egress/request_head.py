"""One bounded proxy request head: read it, parse it, and say what the client asked for.

Two forms are carried: `CONNECT host:port` (HTTPS, the head goes nowhere) and an absolute `http://` URI,
whose head is rewritten for the server (origin-form, no Proxy-* headers, `Connection: close` so one tunnel
carries one request). Everything else is refused, and so is anything two parsers could read differently:
a Host that is not the URI's authority, userinfo, two Content-Lengths, Content-Length with
Transfer-Encoding, bare CR or LF, folded or malformed header lines.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from core.egress_rules import literal_address
from runner.egress.refusal import BAD_REQUEST, FORBIDDEN, Refused

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADER_LINES = 100
HTTP_PORT = 80
HEAD_END = b"\r\n\r\n"
VERSIONS = ("HTTP/1.1", "HTTP/1.0")
MAX_PORT_DIGITS = 5
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(r"[\x21-\x7e]+")  # visible ASCII: no spaces, controls or bytes over 0x7e
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")  # a field value as latin-1: no controls but tab
# Hop-by-hop headers the door does not pass on: the server gets `Connection: close` and nothing to upgrade.
_DROPPED = ("connection", "keep-alive", "upgrade")
_NOT_A_PROXY_REQUEST = "this is a proxy: send CONNECT host:port, or a request for an absolute http:// URI"


class HeadUnfinished(Exception):
    """The client closed (or broke) the connection before its request head ended."""


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    connect: bool  # CONNECT: answer 200 and pipe; else send `head` to the server first
    host: str  # as the client wrote it (an IPv6 address without brackets)
    port: int
    head: bytes  # the rewritten request head for the server; b"" for CONNECT


async def read_head(reader: asyncio.StreamReader) -> bytes:
    """The request head up to and with its blank line; what follows stays in `reader` for the tunnel.
    `reader`'s limit must be MAX_HEAD_BYTES: a head that does not end by then is refused."""
    try:
        return await reader.readuntil(HEAD_END)
    except asyncio.LimitOverrunError as exc:
        raise Refused(BAD_REQUEST, f"the request head is over {MAX_HEAD_BYTES // 1024} KB") from exc
    except asyncio.IncompleteReadError as exc:
        said = "nothing" if not exc.partial else f"{len(exc.partial)} bytes"
        raise HeadUnfinished(f"the client closed before its request head ended (it sent {said})") from exc
    except (ConnectionError, OSError) as exc:
        raise HeadUnfinished(f"the connection broke before the request head ended ({type(exc).__name__})") from exc


def parse_head(raw: bytes) -> ProxyRequest:
    """What a complete head (ending in a blank line) asks for; Refused when the door will not read it as one."""
    if len(raw) > MAX_HEAD_BYTES + len(HEAD_END) or not raw.endswith(HEAD_END):
        raise Refused(BAD_REQUEST, "not a complete request head")
    lines = raw[: -len(HEAD_END)].split(b"\r\n")
    if len(lines) - 1 > MAX_HEADER_LINES:
        raise Refused(BAD_REQUEST, f"over {MAX_HEADER_LINES} header lines")
    method, target, version = _request_line(lines[0])
    headers = [_header(line) for line in lines[1:]]
    if method == "CONNECT":
        host, port = _authority(target, default_port=None)
        _check_host_header(headers, host, port, required=False)
        return ProxyRequest(connect=True, host=host, port=port, head=b"")
    host, port, origin = _absolute_uri(target)
    _check_host_header(headers, host, port, required=True)
    _check_body_framing(headers)
    kept = [line for (name, _), line in zip(headers, lines[1:], strict=True) if not _dropped(name)]
    head = b"\r\n".join([f"{method} {origin} {version}".encode("ascii"), *kept, b"Connection: close"]) + HEAD_END
    return ProxyRequest(connect=False, host=host, port=port, head=head)


def _request_line(line: bytes) -> tuple[str, str, str]:
    parts = line.split(b" ")
    if len(parts) != 3:
        raise Refused(BAD_REQUEST, "the request line is not METHOD TARGET HTTP/1.x")
    method, target, version = (part.decode("latin-1") for part in parts)
    if not _TOKEN.fullmatch(method) or version not in VERSIONS:
        raise Refused(BAD_REQUEST, "the request line is not METHOD TARGET HTTP/1.x")
    if not _TARGET.fullmatch(target):
        raise Refused(BAD_REQUEST, "the request target holds spaces, control or non-ASCII characters")
    return method, target, version


def _header(line: bytes) -> tuple[str, str]:
    """(name in lower case, value without surrounding whitespace) of one header line."""
    text = line.decode("latin-1")
    name, colon, value = text.partition(":")
    if not colon or not _TOKEN.fullmatch(name):  # also a folded line, or a space before the colon
        raise Refused(BAD_REQUEST, f"a malformed header line: {text[:60]!r}")
    if not _VALUE.fullmatch(value):  # a bare CR or LF, NUL or another control character
        raise Refused(BAD_REQUEST, f"a control character in the {name[:40]} header")
    return name.lower(), value.strip(" \t")


def _dropped(name: str) -> bool:
    return name in _DROPPED or name.startswith("proxy-")


def _authority(text: str, *, default_port: int | None) -> tuple[str, int]:
    """(host, port) of `host:port`, `[v6]:port` or, with a default port, just the host."""
    if "@" in text:
        raise Refused(FORBIDDEN, f"userinfo in {text[:80]!r}: name only the host, no user@ in front")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        address = literal_address(host)
        if not bracket or address is None or address.version != 6:
            raise Refused(BAD_REQUEST, f"{text[:80]!r}: brackets hold an IPv6 address")
    else:
        host, colon, port_text = text.partition(":")
        if ":" in port_text:
            raise Refused(BAD_REQUEST, f"{text[:80]!r}: an IPv6 address goes in brackets, [::1]:443")
        rest = colon + port_text
    if not host:
        raise Refused(BAD_REQUEST, f"{text[:80]!r} names no host")
    if not rest:
        if default_port is None:
            raise Refused(BAD_REQUEST, f"{text[:80]!r}: CONNECT needs host:port")
        return host, default_port
    port_text = rest[1:]
    if not rest.startswith(":") or not port_text.isascii() or not port_text.isdigit():
        raise Refused(BAD_REQUEST, f"{text[:80]!r}: the port is not a number")
    if len(port_text) > MAX_PORT_DIGITS:
        raise Refused(BAD_REQUEST, f"{text[:80]!r}: the port is not a port")
    return host, int(port_text)


def _absolute_uri(target: str) -> tuple[str, int, str]:
    """(host, port, origin-form target) of `http://authority[/path][?query]`."""
    scheme, sep, rest = target.partition("://")
    if not sep or target.startswith("/"):
        raise Refused(BAD_REQUEST, _NOT_A_PROXY_REQUEST)
    if scheme.lower() == "https":
        raise Refused(BAD_REQUEST, "an https:// URI goes through CONNECT host:443 (the door adds no TLS)")
    if scheme.lower() != "http":
        raise Refused(BAD_REQUEST, f"only http:// URIs are carried, not {scheme[:20]}://")
    if "#" in rest:
        raise Refused(BAD_REQUEST, "a fragment (#) has no place in a request target")
    end = min((index for index in (rest.find("/"), rest.find("?")) if index >= 0), default=len(rest))
    host, port = _authority(rest[:end], default_port=HTTP_PORT)
    origin = rest[end:]
    return host, port, origin if origin.startswith("/") else "/" + origin


def _check_host_header(headers: list[tuple[str, str]], host: str, port: int, *, required: bool) -> None:
    """The Host header names what the target names (case aside; no port: the target's default for http)."""
    values = [value for name, value in headers if name == "host"]
    if len(values) > 1:
        raise Refused(BAD_REQUEST, "two Host headers")
    if not values:
        if required:
            raise Refused(BAD_REQUEST, "no Host header (it must name the URI's host)")
        return
    try:
        named_host, named_port = _authority(values[0], default_port=HTTP_PORT if required else port)
    except Refused as exc:
        raise Refused(BAD_REQUEST, f"the Host header is not host[:port]: {exc.reason}") from exc
    if (named_host.lower(), named_port) != (host.lower(), port):
        raise Refused(BAD_REQUEST, f"the Host header ({values[0][:80]}) is not the target's {host[:80]}:{port}")


def _check_body_framing(headers: list[tuple[str, str]]) -> None:
    """One way to tell where the body ends, or the server and the door could disagree (request smuggling)."""
    lengths = [value for name, value in headers if name == "content-length"]
    encodings = [value for name, value in headers if name == "transfer-encoding"]
    if len(lengths) > 1:
        raise Refused(BAD_REQUEST, "two Content-Length headers")
    if lengths and encodings:
        raise Refused(BAD_REQUEST, "Content-Length together with Transfer-Encoding")
    if lengths and not (lengths[0].isascii() and lengths[0].isdigit()):
        raise Refused(BAD_REQUEST, "a Content-Length that is not a number")
    if len(encodings) > 1 or (encodings and encodings[0].lower() != "chunked"):
        raise Refused(BAD_REQUEST, "a Transfer-Encoding other than one `chunked`")
