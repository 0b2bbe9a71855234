"""A proxy request head is read one way only: CONNECT host:port, or an absolute http:// URI whose Host agrees,
rewritten for the server; whatever two parsers could read differently is refused."""

from __future__ import annotations

import asyncio

import pytest

from runner.egress.refusal import BAD_REQUEST, FORBIDDEN, Refused, answer
from runner.egress.request_head import (
    MAX_HEAD_BYTES,
    MAX_HEADER_LINES,
    HeadUnfinished,
    parse_head,
    read_head,
)


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def refusal(raw: bytes) -> Refused:
    with pytest.raises(Refused) as caught:
        parse_head(raw)
    return caught.value


def test_connect_names_host_and_port_and_sends_nothing_on() -> None:
    request = parse_head(head("CONNECT Example.org:443 HTTP/1.1", "Host: example.org:443", "User-Agent: x"))
    assert (request.connect, request.host, request.port, request.head) == (True, "Example.org", 443, b"")


def test_connect_to_an_ipv6_address_takes_brackets() -> None:
    request = parse_head(head("CONNECT [::1]:8443 HTTP/1.1"))
    assert (request.host, request.port) == ("::1", 8443)
    assert refusal(head("CONNECT ::1:8443 HTTP/1.1")).status == BAD_REQUEST


@pytest.mark.parametrize(
    "target", ["example.org", "example.org:", "example.org:https", "example.org:+443", "example.org:123456", ":443"]
)
def test_connect_without_a_numeric_port_or_host_is_malformed(target: str) -> None:
    assert refusal(head(f"CONNECT {target} HTTP/1.1")).status == BAD_REQUEST


def test_connect_with_a_host_header_naming_elsewhere_is_refused() -> None:
    assert parse_head(head("CONNECT example.org:443 HTTP/1.1", "Host: EXAMPLE.org")).port == 443
    refused = refusal(head("CONNECT example.org:443 HTTP/1.1", "Host: evil.test:443"))
    assert refused.status == BAD_REQUEST and "Host header" in refused.reason


def test_an_absolute_uri_is_rewritten_to_origin_form_without_proxy_headers_and_with_connection_close() -> None:
    request = parse_head(
        head(
            "GET http://Example.org:8080/a/b?c=d HTTP/1.1",
            "Host: example.org:8080",
            "Proxy-Authorization: Basic c2VjcmV0",
            "Proxy-Connection: keep-alive",
            "Connection: keep-alive",
            "Keep-Alive: timeout=5",
            "Upgrade: websocket",
            "Accept: */*",
        )
    )
    assert (request.connect, request.host, request.port) == (False, "Example.org", 8080)
    assert request.head == head("GET /a/b?c=d HTTP/1.1", "Host: example.org:8080", "Accept: */*", "Connection: close")


@pytest.mark.parametrize(
    ("target", "origin"),
    [("http://example.org", "/"), ("http://example.org?q=1", "/?q=1"), ("HTTP://example.org/", "/")],
)
def test_an_absolute_uri_without_a_path_asks_for_the_root(target: str, origin: str) -> None:
    request = parse_head(head(f"GET {target} HTTP/1.0", "Host: example.org"))
    assert request.port == 80
    assert request.head.startswith(f"GET {origin} HTTP/1.0\r\n".encode())


def test_userinfo_in_the_uri_is_refused() -> None:
    # `http://allowed@evil/` asks for evil; a parser that took what comes before @ as the host would be fooled.
    refused = refusal(head("GET http://allowed.test@evil.test/ HTTP/1.1", "Host: allowed.test"))
    assert refused.status == FORBIDDEN and "userinfo" in refused.reason


@pytest.mark.parametrize(
    "host_header",
    ["evil.test", "allowed.test:8080", "allowed.test.", "allowed.test:80:80", "allowed.test@evil.test", "[::1]"],
)
def test_a_host_header_other_than_the_uri_authority_is_refused(host_header: str) -> None:
    refused = refusal(head("GET http://allowed.test/ HTTP/1.1", f"Host: {host_header}"))
    assert refused.status == BAD_REQUEST and "Host header" in refused.reason


def test_host_compares_without_case_and_with_port_80_by_default() -> None:
    assert parse_head(head("GET http://Allowed.TEST/ HTTP/1.1", "Host: allowed.test:80")).host == "Allowed.TEST"
    assert parse_head(head("GET http://allowed.test:80/ HTTP/1.1", "Host: ALLOWED.test")).port == 80


def test_an_absolute_uri_needs_exactly_one_host_header() -> None:
    assert "no Host" in refusal(head("GET http://allowed.test/ HTTP/1.1")).reason
    twice = head("GET http://allowed.test/ HTTP/1.1", "Host: allowed.test", "Host: allowed.test")
    assert "two Host" in refusal(twice).reason


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (["Content-Length: 3", "Content-Length: 3"], "two Content-Length"),
        (["Content-Length: 3", "Transfer-Encoding: chunked"], "Transfer-Encoding"),
        (["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], "Transfer-Encoding"),
        (["Transfer-Encoding: chunked, identity"], "Transfer-Encoding"),
        (["Content-Length: +3"], "not a number"),
    ],
)
def test_ambiguous_body_framing_is_refused(lines: list[str], why: str) -> None:
    refused = refusal(head("POST http://allowed.test/ HTTP/1.1", "Host: allowed.test", *lines))
    assert refused.status == BAD_REQUEST and why in refused.reason


def test_one_content_length_or_chunked_passes() -> None:
    assert parse_head(head("POST http://a.test/ HTTP/1.1", "Host: a.test", "Content-Length: 3")).port == 80
    assert parse_head(head("POST http://a.test/ HTTP/1.1", "Host: a.test", "Transfer-Encoding: Chunked")).port == 80


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("GET / HTTP/1.1", "this is a proxy"),
        ("GET https://example.org/ HTTP/1.1", "CONNECT"),
        ("GET ftp://example.org/ HTTP/1.1", "only http://"),
        ("GET http://example.org/#top HTTP/1.1", "fragment"),
        ("OPTIONS * HTTP/1.1", "this is a proxy"),
        ("GET http://example.org/ HTTP/2.0", "METHOD TARGET"),
        ("GET  http://example.org/ HTTP/1.1", "METHOD TARGET"),
        ("GET http://exa\x01mple.org/ HTTP/1.1", "control"),
        ("GET http://example.org/\xe9 HTTP/1.1", "non-ASCII"),
    ],
)
def test_anything_but_connect_or_an_absolute_http_uri_is_malformed(line: str, why: str) -> None:
    refused = refusal(head(line, "Host: example.org"))
    assert refused.status == BAD_REQUEST and why in refused.reason


@pytest.mark.parametrize(
    "line",
    ["Host : a.test", " folded: line", "No colon", "X-Bare: a\rb", "X-Bare: a\nb", "X-Nul: a\x00b", ": empty name"],
)
def test_malformed_header_lines_are_refused(line: str) -> None:
    assert refusal(head("GET http://a.test/ HTTP/1.1", "Host: a.test", line)).status == BAD_REQUEST


def test_over_max_header_lines_is_refused() -> None:
    lines = [f"X-{n}: y" for n in range(MAX_HEADER_LINES)]
    assert parse_head(head("GET http://a.test/ HTTP/1.1", "Host: a.test", *lines[:-1])).port == 80
    assert "header lines" in refusal(head("GET http://a.test/ HTTP/1.1", "Host: a.test", *lines)).reason


def test_raw_garbage_is_malformed() -> None:
    assert refusal(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n").status == BAD_REQUEST
    assert refusal(b"\r\n\r\n").status == BAD_REQUEST


def feed(data: bytes, *, eof: bool) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES)
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_read_head_leaves_what_follows_the_head_for_the_tunnel() -> None:
    reader = feed(b"CONNECT a.test:443 HTTP/1.1\r\n\r\n\x16\x03\x01hello", eof=True)
    assert await read_head(reader) == b"CONNECT a.test:443 HTTP/1.1\r\n\r\n"
    assert await reader.read() == b"\x16\x03\x01hello"


async def test_a_head_over_the_cap_is_refused() -> None:
    reader = feed(b"GET http://a.test/ HTTP/1.1\r\nX: " + b"y" * MAX_HEAD_BYTES, eof=False)
    with pytest.raises(Refused) as caught:
        await read_head(reader)
    assert caught.value.status == BAD_REQUEST and "16 KB" in caught.value.reason


async def test_a_head_cut_short_is_unfinished() -> None:
    with pytest.raises(HeadUnfinished, match="it sent 9 bytes"):
        await read_head(feed(b"CONNECT a", eof=True))
    with pytest.raises(HeadUnfinished, match="sent nothing"):
        await read_head(feed(b"", eof=True))


def test_a_refusal_answer_is_one_short_line_of_text() -> None:
    raw = answer(403, "no\r\nX-Injected: yes")
    assert raw.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert raw.count(b"\r\n") == 5 and raw.endswith(b"no X-Injected: yes\n")
    assert b"Connection: close" in raw
