"""What the door carries: a CONNECT tunnel passes bytes untouched both ways, a plain-HTTP request reaches its
server rewritten for it, and every byte is counted in the connection's event and the run's total."""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import urllib.request
from pathlib import Path

from core.egress_rules import EgressMode, IpAddress
from tests.runner.egress.door_rig import (
    HEAD_END,
    LOOPBACK,
    Events,
    FakeResolver,
    ask,
    body,
    echo_server,
    forwarder,
    open_door,
    read_to_end,
    rules,
    status,
    tunnel,
    web_server,
    within,
)

EVERY_BYTE = bytes(range(256)) * 1024  # 256 KiB holding every byte value: nothing may be changed on the way


async def test_a_connect_tunnel_passes_bytes_untouched_both_ways_and_counts_them(tmp_path: Path) -> None:
    events = Events()
    async with echo_server() as echo:
        target = f"{LOOPBACK}:{echo.port}"
        door_rules = rules(allow=[target])
        async with open_door(tmp_path / "egress.sock", door_rules, events) as door:
            async with tunnel(tmp_path / "egress.sock", target) as (reader, writer):
                writer.write(EVERY_BYTE)
                writer.write_eof()  # the half-close reaches the server, which then ends its side
                assert await within(read_to_end(reader)) == EVERY_BYTE
            event = await events.next()
            assert door.bytes_used == 2 * len(EVERY_BYTE)
    assert (event.host, event.port, event.address) == (LOOPBACK, echo.port, LOOPBACK)
    assert (event.allowed, event.reason) == (True, "")
    assert (event.bytes_up, event.bytes_down) == (len(EVERY_BYTE), len(EVERY_BYTE))
    assert event.started_at <= event.ended_at


async def test_bytes_sent_right_after_the_connect_head_go_through_first(tmp_path: Path) -> None:
    events = Events()
    async with echo_server() as echo:
        target = f"{LOOPBACK}:{echo.port}"
        async with open_door(tmp_path / "egress.sock", rules(allow=[target]), events):
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "egress.sock"))
            try:
                # A client that does not wait for the 200 (its TLS hello already sent): nothing is lost.
                writer.write(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode() + b"\x16\x03\x01early")
                writer.write_eof()
                answer = await within(read_to_end(reader))
            finally:
                writer.close()
            assert answer == b"HTTP/1.1 200 Connection established\r\n\r\n\x16\x03\x01early"
            assert (await events.next()).bytes_up == len(b"\x16\x03\x01early")


async def test_a_plain_get_reaches_the_server_rewritten_and_is_counted(tmp_path: Path) -> None:
    events = Events()
    async with web_server() as server:
        authority = f"{LOOPBACK}:{server.port}"
        async with open_door(tmp_path / "egress.sock", rules(allow=[authority]), events) as door:
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "egress.sock"))
            try:
                writer.write(
                    f"GET http://{authority}/hello?x=1 HTTP/1.1\r\nHost: {authority}\r\n"
                    "Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive\r\n\r\n".encode()
                )
                answer = await within(read_to_end(reader))
            finally:
                writer.close()
            event = await events.next()
            assert door.bytes_used == event.bytes_up + event.bytes_down
    assert status(answer) == 200 and body(answer) == b"hello"
    method, path, headers = server.requests[0]
    assert (method, path) == ("GET", "/hello?x=1")
    assert "Proxy-Authorization" not in headers and headers["Connection"] == "close"
    assert headers["Host"] == authority
    sent = f"GET /hello?x=1 HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    assert (event.allowed, event.reason, event.bytes_up, event.bytes_down) == (True, "", len(sent), len(answer))


async def test_a_post_body_goes_through_after_the_head(tmp_path: Path) -> None:
    events = Events()
    async with web_server() as server:
        authority = f"{LOOPBACK}:{server.port}"
        async with open_door(tmp_path / "egress.sock", rules(allow=[authority]), events):
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "egress.sock"))
            try:
                payload = b"\x00\x01payload\xff" * 1000
                writer.write(
                    f"POST http://{authority}/echo HTTP/1.1\r\nHost: {authority}\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                answer = await within(read_to_end(reader))
            finally:
                writer.close()
    assert status(answer) == 200 and body(answer) == payload


async def test_urllib_through_a_forwarder_reaches_a_listed_name(tmp_path: Path) -> None:
    """As in the container: a client configured with an HTTP proxy on loopback, the forwarder, the door."""
    events = Events()
    async with web_server() as server:
        resolver = FakeResolver({"files.allowed.test": [LOOPBACK]})
        door_rules = rules(allow=[f"*.allowed.test:{server.port}", f"{LOOPBACK}:{server.port}"])
        async with (
            open_door(tmp_path / "egress.sock", door_rules, events, resolver=resolver),
            forwarder(tmp_path / "egress.sock") as port,
        ):
            proxy = urllib.request.ProxyHandler({"http": f"http://{LOOPBACK}:{port}"})
            opener = urllib.request.build_opener(proxy)

            def fetch() -> bytes:
                with opener.open(f"http://files.allowed.test:{server.port}/bytes/5000", timeout=10) as reply:
                    data: bytes = reply.read()
                    return data

            assert await asyncio.to_thread(fetch) == b"x" * 5000
            event = await events.next()
    assert (event.host, event.address, event.allowed) == ("files.allowed.test", LOOPBACK, True)
    assert event.bytes_down > 5000
    assert resolver.calls == ["files.allowed.test"]


async def test_http_client_tunnels_through_a_forwarder_with_connect(tmp_path: Path) -> None:
    events = Events()
    async with web_server() as server:
        resolver = FakeResolver({"api.allowed.test": [LOOPBACK]})
        door_rules = rules(allow=[f"api.allowed.test:{server.port}", f"{LOOPBACK}:{server.port}"])
        async with (
            open_door(tmp_path / "egress.sock", door_rules, events, resolver=resolver),
            forwarder(tmp_path / "egress.sock") as port,
        ):

            def fetch() -> tuple[int, bytes]:
                connection = http.client.HTTPConnection(LOOPBACK, port, timeout=10)
                try:
                    connection.set_tunnel("api.allowed.test", server.port)
                    connection.request("GET", "/hello")
                    reply = connection.getresponse()
                    return reply.status, reply.read()
                finally:
                    connection.close()

            assert await asyncio.to_thread(fetch) == (200, b"hello")
            event = await events.next()
    assert (event.host, event.port, event.allowed) == ("api.allowed.test", server.port, True)


async def test_open_mode_needs_no_pattern_for_a_name(tmp_path: Path) -> None:
    events = Events()
    async with echo_server() as echo:
        # Any name in open mode; its address (loopback here) must still be listed as ip:port.
        resolver = FakeResolver({"anything.example": [LOOPBACK]})
        door_rules = rules(EgressMode.OPEN, [f"{LOOPBACK}:{echo.port}"])
        async with (
            open_door(tmp_path / "egress.sock", door_rules, events, resolver=resolver),
            tunnel(tmp_path / "egress.sock", f"anything.example:{echo.port}") as (reader, writer),
        ):
            writer.write(b"ping")
            assert await within(reader.readexactly(4)) == b"ping"
    assert (await events.next()).allowed


async def test_the_name_is_resolved_once_and_the_checked_address_is_the_one_connected(tmp_path: Path) -> None:
    """DNS rebinding: a name server answering an allowed address first, then another, gains nothing."""
    events = Events()
    async with echo_server() as echo:
        answers = iter([[LOOPBACK], ["10.0.0.1"], ["10.0.0.1"]])
        calls: list[str] = []

        async def rebinding(host: str, port: int) -> list[IpAddress]:
            calls.append(host)
            return [ipaddress.ip_address(text) for text in next(answers)]

        door_rules = rules(allow=[f"rebind.test:{echo.port}", f"{LOOPBACK}:{echo.port}"])
        async with open_door(tmp_path / "egress.sock", door_rules, events, resolver=rebinding):
            async with tunnel(tmp_path / "egress.sock", f"rebind.test:{echo.port}") as (reader, writer):
                writer.write(b"same server")
                assert await within(reader.readexactly(11)) == b"same server"
            event = await events.next()
    assert calls == ["rebind.test"]
    assert event.address == LOOPBACK and echo.accepted == 1


async def test_a_server_that_answers_then_closes_ends_the_tunnel(tmp_path: Path) -> None:
    events = Events()
    async with web_server() as server:
        authority = f"{LOOPBACK}:{server.port}"
        async with open_door(tmp_path / "egress.sock", rules(allow=[authority]), events):
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "egress.sock"))
            try:
                writer.write(f"GET http://{authority}/bytes/100000 HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
                # The client does not close: Connection: close made the server end it, and the door passes it on.
                answer = await within(read_to_end(reader))
            finally:
                writer.close()
            await events.next()
    assert status(answer) == 200 and len(body(answer)) == 100000 and HEAD_END in answer


async def test_a_client_that_ends_its_sending_with_its_head_still_gets_the_whole_answer(tmp_path: Path) -> None:
    """Bytes and the end of the client's sending, all sent with the CONNECT head before its tunnel exists (the door
    is still connecting): they reach the server once the tunnel starts, and the answer comes back whole, counted."""
    events = Events()
    async with echo_server() as echo:
        target = f"{LOOPBACK}:{echo.port}"
        async with open_door(tmp_path / "egress.sock", rules(allow=[target]), events):
            request = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode() + EVERY_BYTE
            answer = await ask(tmp_path / "egress.sock", request, close_after=True)
            event = await events.next()
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\n" + EVERY_BYTE  # echoed, then its end
    assert event.allowed and event.reason == ""
    assert (event.bytes_up, event.bytes_down) == (len(EVERY_BYTE), len(EVERY_BYTE))
