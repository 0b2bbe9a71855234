"""What a run can hold through its door is bounded: connections at once, bytes in all, time to send a head;
closing the door ends everything it holds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path

from container.splice import PIPE_BYTES, UNIX_SEND_BYTES
from runner.egress.records import EgressEvent
from tests.runner.egress.door_rig import (
    HEAD_END,
    LOOPBACK,
    Events,
    ask,
    body,
    echo_server,
    open_door,
    read_to_end,
    rules,
    status,
    tunnel,
    web_server,
    within,
)

BUDGET = 64 * 1024
# asyncio's stream reads ahead up to twice its 64 KiB limit, plus one read of its transport's 256 KiB at most.
STREAM_READ_AHEAD_BYTES = 2 * 64 * 1024 + 256 * 1024


async def test_over_the_connection_cap_is_429_without_connecting(tmp_path: Path) -> None:
    events = Events()
    path = tmp_path / "egress.sock"
    async with echo_server() as echo:
        target = f"{LOOPBACK}:{echo.port}"
        async with open_door(path, rules(allow=[target], max_connections=2), events):
            async with tunnel(path, target), tunnel(path, target):
                answer = await ask(path, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
                refused = await events.next()
                assert echo.accepted == 2
            await events.wait_for(3)  # both tunnels ended: their slots are free again
            async with tunnel(path, target) as (reader, writer):
                writer.write(b"again")
                assert await within(reader.readexactly(5)) == b"again"
    assert status(answer) == 429 and b"SUBAGENT_EGRESS_MAX_CONNECTIONS (2)" in body(answer)
    assert (refused.host, refused.port, refused.allowed) == (LOOPBACK, echo.port, False)


async def test_a_run_over_its_byte_budget_has_every_tunnel_cut_and_new_ones_refused(tmp_path: Path) -> None:
    events = Events()
    path = tmp_path / "egress.sock"
    async with echo_server() as echo:
        target = f"{LOOPBACK}:{echo.port}"
        async with open_door(path, rules(allow=[target], max_bytes=BUDGET), events) as door:
            async with tunnel(path, target) as (idle_reader, _), tunnel(path, target) as (reader, writer):
                writer.write(b"z" * (2 * BUDGET))  # echoed back: twice the budget each way
                received = await within(read_to_end(reader))
                assert await within(read_to_end(idle_reader)) == b""  # the other tunnel is cut too
                cut = await events.wait_for(2)
            answer = await ask(path, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
            refused = await events.wait_for(3)
            assert door.bytes_used == BUDGET
    assert len(received) < BUDGET  # cut mid-transfer
    for event in cut:
        assert event.allowed and event.reason.startswith("cut: this run has used its SUBAGENT_EGRESS_MAX_MB")
    assert sum(event.bytes_up + event.bytes_down for event in cut) == BUDGET
    assert status(answer) == 403 and b"SUBAGENT_EGRESS_MAX_MB (0.062 MB" in body(answer)
    assert not refused[2].allowed and "SUBAGENT_EGRESS_MAX_MB" in refused[2].reason
    assert echo.accepted == 2


async def test_a_plain_download_over_the_budget_is_cut(tmp_path: Path) -> None:
    events = Events()
    path = tmp_path / "egress.sock"
    async with web_server() as server:
        authority = f"{LOOPBACK}:{server.port}"
        async with open_door(path, rules(allow=[authority], max_bytes=BUDGET), events):
            answer = await ask(
                path, f"GET http://{authority}/bytes/1000000 HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
            )
            event = await events.next()
    assert status(answer) == 200 and len(answer) < BUDGET
    assert event.reason.startswith("cut: this run has used") and event.bytes_up + event.bytes_down == BUDGET


async def test_a_slowloris_client_is_cut_at_the_head_deadline(tmp_path: Path) -> None:
    events = Events()
    path = tmp_path / "egress.sock"
    deadline = 0.3
    async with open_door(path, rules(allow=["allowed.test"]), events, head_seconds=deadline):
        reader, writer = await asyncio.open_unix_connection(str(path))

        async def dribble() -> None:
            # One byte at a time, the head never quite ending: each byte would reset a per-read timeout.
            for byte in b"CONNECT allowed.test:443 HTTP/1.1\r\nX: " + b"y" * 10_000:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.01)

        started = time.monotonic()
        sending = asyncio.create_task(dribble())
        try:
            head = await within(reader.readuntil(HEAD_END))
            answer = head + await within(reader.readuntil(b"\n"))
            took = time.monotonic() - started
        finally:
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)
            writer.close()
        event = await events.next()
    assert status(answer) == 408 and deadline <= took < deadline + 2
    assert event.reason == "the request head did not arrive within 0.3 s" and not event.allowed


async def test_ten_thousand_connections_at_once_leave_the_loop_free_and_no_descriptor_behind(tmp_path: Path) -> None:
    """A flood of connections: those over the opening cap are answered as they come, the loop keeps serving
    others meanwhile, every attempt is reported, and once they are gone the door holds nothing more."""
    attempts = 10_000
    events = Events()
    path = tmp_path / "egress.sock"
    async with echo_server() as echo, web_server() as other:
        target = f"{LOOPBACK}:{echo.port}"
        descriptors_before = len(os.listdir("/proc/self/fd"))
        async with open_door(path, rules(allow=[target]), events):
            flood: list[socket.socket] = []
            try:
                for _ in range(attempts):
                    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    client.setblocking(False)
                    flood.append(client)
                    while True:
                        try:
                            client.connect(str(path))
                            break
                        except BlockingIOError:  # the backlog is full: let the door take some
                            await asyncio.sleep(0)
                # Meanwhile another chat's work is served on the same loop...
                reader, writer = await asyncio.open_connection(LOOPBACK, other.port)
                writer.write(f"GET /hello HTTP/1.1\r\nHost: {LOOPBACK}\r\nConnection: close\r\n\r\n".encode())
                assert body(await within(read_to_end(reader), 5)) == b"hello"
                writer.close()
            finally:
                for client in flood:
                    client.close()
            reported = await events.wait_for(attempts)
            # ...and the door serves the run again once the flood is gone.
            async with tunnel(path, target) as (reader, writer):
                writer.write(b"served")
                assert await within(reader.readexactly(6)) == b"served"
        await echo.settled()
        assert len(os.listdir("/proc/self/fd")) == descriptors_before
    turned_away = [event for event in reported if "still sending their request head" in event.reason]
    assert turned_away and all(not event.allowed for event in reported)


async def test_closing_the_door_cuts_its_tunnels_and_removes_the_socket(tmp_path: Path) -> None:
    events = Events()
    path = tmp_path / "egress.sock"
    async with echo_server() as echo:
        target = f"{LOOPBACK}:{echo.port}"
        async with open_door(path, rules(allow=[target]), events) as door:
            async with tunnel(path, target) as (reader, writer):
                half_sent = await asyncio.open_unix_connection(str(path))
                half_sent[1].write(b"CONNECT 127.0.0.1")
                writer.write(b"x")
                assert await within(reader.readexactly(1)) == b"x"
                await door.close()
                assert await within(read_to_end(reader)) == b""
                half_sent[1].close()
            await door.close()  # again: nothing happens
    reasons = sorted(event.reason for event in await events.wait_for(2))
    assert reasons == ["cut: the run's door closed", "the run's door closed"]
    assert not path.exists()


async def test_an_event_recorder_that_fails_does_not_stop_the_door(tmp_path: Path) -> None:
    events = Events()

    def failing(event: EgressEvent) -> None:
        events(event)
        raise RuntimeError("the store is down")

    path = tmp_path / "egress.sock"
    async with echo_server() as echo:
        target = f"{LOOPBACK}:{echo.port}"
        async with open_door(path, rules(allow=[target]), failing):
            assert status(await ask(path, b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")) == 403
            async with tunnel(path, target) as (reader, writer):
                writer.write(b"ok")
                assert await within(reader.readexactly(2)) == b"ok"
    assert len(await events.wait_for(2)) == 2


async def test_a_listed_address_with_nothing_listening_is_a_502(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago, and is closed now
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    events = Events()
    async with open_door(tmp_path / "egress.sock", rules(allow=[f"{LOOPBACK}:{port}"]), events):
        answer = await ask(tmp_path / "egress.sock", f"CONNECT {LOOPBACK}:{port} HTTP/1.1\r\n\r\n".encode())
        event = await events.next()
    assert status(answer) == 502 and "could not connect on port" in event.reason and event.address is None


async def test_a_server_that_never_answers_the_connect_is_a_504(tmp_path: Path) -> None:
    events = Events()
    with socket.socket() as full:
        # A listener whose queue is full drops the next connection's SYN: the connect hangs.
        full.bind((LOOPBACK, 0))
        full.listen(0)
        port = full.getsockname()[1]
        queued = [socket.socket() for _ in range(3)]
        try:
            for client in queued:
                client.setblocking(False)
                client.connect_ex((LOOPBACK, port))
            door_rules = rules(allow=[f"{LOOPBACK}:{port}"])
            async with open_door(tmp_path / "egress.sock", door_rules, events, connect_seconds=0.3):
                answer = await ask(tmp_path / "egress.sock", f"CONNECT {LOOPBACK}:{port} HTTP/1.1\r\n\r\n".encode())
                event = await events.next()
        finally:
            for client in queued:
                client.close()
    assert status(answer) == 504 and "no answer in 0.3 s" in event.reason


async def test_a_client_that_stops_reading_holds_the_door_to_its_buffers_and_close_cuts_it(tmp_path: Path) -> None:
    """A server that sends without end to a client that reads nothing: what the door moves stops growing at what
    the sockets' buffers and one pipe of its relay hold (its tunnel's threads block, nothing piles up in the bot),
    and closing the door cuts it, with every byte it moved counted."""

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"x" * 65536)
                await writer.drain()

    events = Events()
    path = tmp_path / "egress.sock"
    server = await asyncio.start_server(flood, LOOPBACK, 0)
    target = f"{LOOPBACK}:{server.sockets[0].getsockname()[1]}"
    try:
        async with open_door(path, rules(allow=[target]), events) as door, tunnel(path, target) as (_, writer):
            moved = -1
            while moved != door.bytes_used:  # settles once every buffer on the way is full
                moved = door.bytes_used
                await asyncio.sleep(0.3)
            client = writer.get_extra_info("socket")
            buffers = sum(client.getsockopt(socket.SOL_SOCKET, opt) for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF))
            # The Unix socket's buffers (the door's end sends with its raised buffer, the kernel doubling it), the
            # relay's pipe, and what this test's stream read before it paused.
            assert 0 < moved <= buffers + 2 * UNIX_SEND_BYTES + PIPE_BYTES + STREAM_READ_AHEAD_BYTES
            await door.close()
        event = await events.next()
    finally:
        server.close()
        await server.wait_closed()
    assert event.reason == "cut: the run's door closed" and event.allowed
    assert event.bytes_up + event.bytes_down == moved  # the CONNECT head is not counted; every byte moved is
