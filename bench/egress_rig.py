"""What the egress benchmark drives: a web server and curl (each a process of its own), the container's
forwarder in a process of its own, and two bare relays that carry bytes the way the door's path does.

- `WebServer`: the standard library's `http.server` on 127.0.0.1 (a port the kernel picks) serving a folder,
  a thread per connection, `Connection: close`. A process of its own: its work is not the door's loop's.
- `curl`: one transfer (a new connection each), timed by curl itself (`time_total`: from the start of the
  transfer to its end, so the process's own start and exit are not in it); proxy variables are removed from
  its environment, so only `--proxy` sends it through the door.
- `ForwarderProcess`: `container.forwarder.Forwarder`, the code the container runs, in a Python process of its
  own (no Docker), so the door is alone on this loop.
- `BareRelays`: TCP → Unix socket → TCP, two relays in threads of this process with blocking
  `recv_into`/`sendall` copies of 1 MiB: the door's byte path with nothing checked, parsed or counted.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from bench.common import stop_child
from bench.thread_server import ThreadServer
from container.forwarder import shell_environment

LOOPBACK = "127.0.0.1"
START_TIMEOUT_SECONDS = 30.0
CURL_TIMEOUT_SECONDS = 60
CURL_FORMAT = "%{http_code} %{size_download} %{time_total}"
RELAY_BUFFER_BYTES = 1024 * 1024
REPO_ROOT = Path(__file__).resolve().parent.parent
FORWARDER_CODE = (
    "import asyncio, sys\n"
    "from pathlib import Path\n"
    "from container.forwarder import Forwarder\n"
    "async def main() -> None:\n"
    "    async with Forwarder(Path(sys.argv[1])) as forwarder:\n"
    "        print(forwarder.url, flush=True)\n"
    "        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)\n"
    "asyncio.run(main())\n"
)
_SERVING = re.compile(rb" port (\d+) ")


@dataclass(frozen=True, slots=True)
class Transfer:
    status: int
    size: int
    seconds: float  # curl's time_total


async def curl(url: str, *, proxy: str | None = None, tunnel: bool = False, output: Path | None = None) -> Transfer:
    """One GET of `url` by curl (through `proxy` if given; with `tunnel`, inside a CONNECT tunnel)."""
    binary = shutil.which("curl")
    if binary is None:
        raise RuntimeError("the egress benchmark needs curl on the host (apt-get install curl)")
    args = ["-q", "--silent", "--show-error", "--max-time", str(CURL_TIMEOUT_SECONDS), "--write-out", CURL_FORMAT]
    args += ["--output", str(output) if output is not None else os.devnull]
    if proxy is not None:
        args += ["--proxy", proxy] + (["--proxytunnel"] if tunnel else [])
    process = await asyncio.create_subprocess_exec(
        binary,
        *args,
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=shell_environment(os.environ, None),
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"curl {url} (proxy {proxy}) failed: {err.decode(errors='replace').strip()[:300]}")
    status, size, seconds = out.split()
    return Transfer(int(status), int(size), float(seconds))


class WebServer:
    """`python -m http.server` on 127.0.0.1 serving `folder`, from `async with` until its end."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._process: asyncio.subprocess.Process | None = None
        self.port = 0

    async def __aenter__(self) -> Self:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-u",
            "-m",
            "http.server",
            "--bind",
            LOOPBACK,
            "--directory",
            str(self._folder),
            "0",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,  # a line per request
        )
        assert self._process.stdout is not None
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            line = await self._process.stdout.readline()
        found = _SERVING.search(line)
        if found is None:
            raise RuntimeError(f"http.server did not say its port: {line!r}")
        self.port = int(found.group(1))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()  # our own child; it serves until told
            await self._process.wait()


class ForwarderProcess:
    """The container's forwarder in a process of its own, relaying to the door at `door`."""

    def __init__(self, door: Path) -> None:
        self._door = door
        self._process: asyncio.subprocess.Process | None = None
        self.url = ""

    async def __aenter__(self) -> Self:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            FORWARDER_CODE,
            str(self._door),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO_ROOT,
        )
        assert self._process.stdout is not None
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            self.url = (await self._process.stdout.readline()).decode().strip()
        if not self.url.startswith("http://"):
            raise RuntimeError(f"the forwarder process did not say its URL: {self.url!r}")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is not None:
            await stop_child(self._process)


def _pipe(source: socket.socket, target: socket.socket) -> None:
    buffer = bytearray(RELAY_BUFFER_BYTES)
    view = memoryview(buffer)
    try:
        while count := source.recv_into(buffer):
            target.sendall(view[:count])
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class BareRelays:
    """curl → 127.0.0.1:`port` → Unix socket → the web server: what two relays with no checks cost."""

    def __init__(self, work_dir: Path, server_port: int) -> None:
        self._unix_path = str(work_dir / "relay.sock")
        self._server_port = server_port
        self._server = ThreadServer("bare-relay")
        self.port = 0

    def __enter__(self) -> Self:
        self._server.__enter__()
        back = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        back.bind(self._unix_path)
        self._server.serve(back, lambda client: self._relay(client, self._dial_server()))
        front = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        front.bind((LOOPBACK, 0))
        self.port = front.getsockname()[1]
        self._server.serve(front, lambda client: self._relay(client, self._dial_back()))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.__exit__(exc_type, exc, tb)
        os.unlink(self._unix_path)

    def _dial_server(self) -> socket.socket:
        return socket.create_connection((LOOPBACK, self._server_port))

    def _dial_back(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self._unix_path)
        return sock

    def _relay(self, client: socket.socket, onward: socket.socket) -> None:
        self._server.keep(onward)
        self._server.spawn(_pipe, onward, client)
        _pipe(client, onward)
