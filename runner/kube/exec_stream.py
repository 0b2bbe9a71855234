"""An exec into a pod's container as a byte stream: the bridge's way into a pod that has no network.

The official client's stream module polls its websocket in a thread; this speaks the same protocol with aiohttp
on the event loop, taking the server, TLS material and token from the client's own `Configuration`. Subprotocol
`v4.channel.k8s.io`: each binary message starts with its channel (0 stdin, 1 stdout, 2 stderr, 3 the exec's
status as JSON). stdout is fed into an asyncio StreamReader (its messages need not align with anything the
reader parses), bounded: the websocket is not read while the reader holds more than twice its limit. stderr
keeps its last STDERR_TAIL_BYTES for the log. Exec output is not written to the node's container log, which
is why this is an exec and not an attach.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Mapping, Sequence
from enum import IntEnum
from typing import Any, cast

import aiohttp
from kubernetes import client
from yarl import URL

EXEC_SUBPROTOCOL = "v4.channel.k8s.io"
DEFAULT_CONTAINER = "agent"
STDOUT_LIMIT_BYTES = 256 * 1024  # the reader's limit: the websocket is not read past twice this
STDERR_TAIL_BYTES = 8 * 1024
MAX_MESSAGE_BYTES = 1024 * 1024  # one websocket message; the API server sends far smaller ones
MAX_STATUS_BYTES = 16 * 1024
CONNECT_TIMEOUT_SECONDS = 30.0
# Pings on an idle exec: a connection to the API server that died silently ends the session within about this
# long (the bridge then opens a new one) instead of at the run's deadline. The API server answers them.
EXEC_HEARTBEAT_SECONDS = 30.0
CLOSE_TIMEOUT_SECONDS = 5.0


class ExecChannel(IntEnum):
    STDIN = 0
    STDOUT = 1
    STDERR = 2
    STATUS = 3


class ExecFailed(Exception):
    """The exec could not be opened (refused, no such pod or container, not running)."""


def exec_url(
    configuration: client.Configuration, namespace: str, pod: str, command: Sequence[str], container: str
) -> URL:
    """The exec endpoint of `pod`, with each argument of `command` as its own `command=` parameter."""
    query = [("container", container)]
    query += [("command", argument) for argument in command]
    query += [("stdin", "true"), ("stdout", "true"), ("stderr", "true")]
    base = URL(str(configuration.host).rstrip("/"))
    return base.with_path(f"{base.path.rstrip('/')}/api/v1/namespaces/{namespace}/pods/{pod}/exec").with_query(query)


def connection_settings(configuration: client.Configuration) -> tuple[ssl.SSLContext | None, dict[str, str]]:
    """The TLS context and the auth headers the client's Configuration describes. Blocking (reads the key files
    and may run a token refresh hook): call it in a thread."""
    headers: dict[str, str] = {}
    auth = cast(Mapping[str, Mapping[str, Any]], configuration.auth_settings())
    for setting in auth.values():
        if setting.get("in") == "header" and setting.get("value"):
            headers[str(setting["key"])] = str(setting["value"])
    if not str(configuration.host).startswith("https"):
        return None, headers
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert, cadata=configuration.ca_cert_data)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif configuration.assert_hostname is False:
        context.check_hostname = False
    return context, headers


class ExecStream:
    """One exec's stdin and stdout as a byte stream: `reader`, `write()`, `close()`; its stderr tail and status."""

    def __init__(self, session: aiohttp.ClientSession, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._session = session
        self._socket = socket
        self._reader = asyncio.StreamReader(limit=STDOUT_LIMIT_BYTES)
        self._gate = _ReadGate()
        self._reader.set_transport(self._gate)  # the reader pauses and resumes the gate as it fills and drains
        self._stderr = bytearray()
        self._status: dict[str, Any] | None = None
        self._error: str | None = None
        self._pump = asyncio.create_task(self._receive())

    @property
    def reader(self) -> asyncio.StreamReader:
        return self._reader

    @property
    def stderr_tail(self) -> bytes:
        return bytes(self._stderr)

    @property
    def status(self) -> dict[str, Any] | None:
        """The exec's status (a metav1.Status) once the API server has sent it: how the command ended."""
        return self._status

    @property
    def exit_code(self) -> int | None:
        """The command's exit status, when the status says it (0 on Success)."""
        if self._status is None:
            return None
        if self._status.get("status") == "Success":
            return 0
        for cause in (self._status.get("details") or {}).get("causes") or []:
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                with contextlib.suppress(TypeError, ValueError):
                    return int(str(cause.get("message")))
        return None

    def describe(self) -> str:
        parts = []
        if self._status is not None:
            parts.append(f"status {self._status.get('status')}: {self._status.get('message', '')}".rstrip(": "))
        if self._error is not None:
            parts.append(self._error)
        if self._stderr:
            parts.append("stderr: " + self._stderr.decode(errors="replace").strip())
        return "; ".join(parts) or "no status"

    async def write(self, data: bytes) -> None:
        """Send `data` to the command's stdin; waits while the connection's buffer is full."""
        if self._socket.closed:
            raise ConnectionResetError("the exec stream is closed")
        await self._socket.send_bytes(bytes((ExecChannel.STDIN,)) + data)

    async def wait_closed(self) -> None:
        """Wait until the API server has ended the stream (the command exited, or the connection broke)."""
        await asyncio.wait({self._pump})

    async def close(self) -> None:
        """Close the stream (the command's stdin ends with it) and the connection."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT_SECONDS):
                await self._socket.close()
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        await self._session.close()

    async def _receive(self) -> None:
        try:
            while True:
                await self._gate.wait()
                message = await self._socket.receive()
                if message.type is aiohttp.WSMsgType.BINARY:
                    self._take(message.data)
                elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                    break
                elif message.type is aiohttp.WSMsgType.ERROR:
                    self._error = f"websocket error: {message.data}"
                    break
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            self._reader.feed_eof()

    def _take(self, data: bytes) -> None:
        if not data:
            return
        channel, body = data[0], data[1:]
        if channel == ExecChannel.STDOUT and body:
            self._reader.feed_data(body)
        elif channel == ExecChannel.STDERR:
            self._stderr += body
            del self._stderr[:-STDERR_TAIL_BYTES]
        elif channel == ExecChannel.STATUS and len(body) <= MAX_STATUS_BYTES:
            with contextlib.suppress(ValueError):
                status = json.loads(body)
                if isinstance(status, dict):
                    self._status = status


class _ReadGate(asyncio.ReadTransport):
    """The reader's 'transport': it pauses when the reader is full, and the websocket is read only while open."""

    def __init__(self) -> None:
        super().__init__()
        self._open = asyncio.Event()
        self._open.set()

    def pause_reading(self) -> None:
        self._open.clear()

    def resume_reading(self) -> None:
        self._open.set()

    def is_reading(self) -> bool:
        return self._open.is_set()

    async def wait(self) -> None:
        await self._open.wait()


async def open_exec(
    configuration: client.Configuration,
    namespace: str,
    pod: str,
    command: Sequence[str],
    *,
    container: str = DEFAULT_CONTAINER,
) -> ExecStream:
    """Start `command` in `pod`'s `container` with stdin, stdout and stderr, and return it as a stream.
    `configuration` is a `kubernetes.client.Configuration`. A refusal raises ExecFailed."""
    context, headers = await asyncio.to_thread(connection_settings, configuration)
    url = exec_url(configuration, namespace, pod, command, container)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SECONDS))
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
            socket = await session.ws_connect(
                url,
                protocols=(EXEC_SUBPROTOCOL,),
                headers=headers,
                ssl=context if context is not None else True,
                max_msg_size=MAX_MESSAGE_BYTES,
                autoping=True,
                heartbeat=EXEC_HEARTBEAT_SECONDS,
                compress=0,
            )
    except aiohttp.WSServerHandshakeError as exc:
        await session.close()
        raise ExecFailed(
            f"the API server refused the exec into {namespace}/{pod}: HTTP {exc.status} {exc.message}"
        ) from None
    except BaseException:
        await session.close()
        raise
    if socket.protocol != EXEC_SUBPROTOCOL:
        await socket.close()
        await session.close()
        raise ExecFailed(f"the API server chose subprotocol {socket.protocol!r}, not {EXEC_SUBPROTOCOL}")
    return ExecStream(session, socket)
