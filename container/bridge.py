"""`python -m container.bridge [--egress]`: the run channel inside a pod that shares no folder with the host.

The host execs this in the running container and talks to it over its stdin and stdout (container/mux.py).
Once the host's HELLO has come, it listens on the channel folder's run socket (and, with --egress, the door's)
and carries each connection the agent makes there to the host as a stream. It ends when its stdin does (the
host went away): the listeners are closed first, then every connection. Nothing but frames goes to stdout;
diagnostics go to stderr, one short line each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from container.contract import BRIDGE_TARGET_EGRESS, BRIDGE_TARGET_RUN
from container.mux import Mux, Role
from container.mux_frames import HEADER, MAX_FRAME_PAYLOAD_BYTES, MuxError
from container.paths import ContainerPaths

EXIT_OK = 0  # stdin ended: the host went away
EXIT_FAILED = 1  # the bridge could not listen, or its stdout broke
EXIT_PROTOCOL = 2  # the host broke the protocol
STDIN_LIMIT_BYTES = 2 * (HEADER.size + MAX_FRAME_PAYLOAD_BYTES)  # reading pauses past twice this


def _say(line: str) -> None:
    """One diagnostic line on stderr; never fails the bridge."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"bridge: {line}\n")
        sys.stderr.flush()


async def _pipes(stdin_fd: int, stdout_fd: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """stdin and stdout as asyncio pipes, binary and unbuffered."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STDIN_LIMIT_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(stdin_fd, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), os.fdopen(stdout_fd, "wb", 0)
    )
    return reader, asyncio.StreamWriter(transport, protocol, None, loop)


def _unlink_stale(path: Path) -> None:
    """A socket left by an earlier bridge (or anything else at the path, not a folder) is removed."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(path.lstat().st_mode):
            path.unlink()


async def serve(paths: ContainerPaths, *, egress: bool, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """Bridge until stdin ends; returns the exit status."""
    reader, writer = await _pipes(stdin_fd, stdout_fd)

    async def sink(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    mux = Mux(Role.POD, reader, sink)
    sockets = {BRIDGE_TARGET_RUN: paths.channel_socket}
    if egress:
        sockets[BRIDGE_TARGET_EGRESS] = paths.egress_socket
    servers: list[asyncio.Server] = []
    running = asyncio.create_task(mux.run())
    try:
        if await mux.wait_session():
            for target, path in sockets.items():
                servers.append(await _listen(mux, target, path))
            _say(f"listening on {', '.join(str(p) for p in sockets.values())}")
        await running
        return EXIT_OK
    except MuxError as exc:
        _say(f"the host broke the protocol: {exc}")
        return EXIT_PROTOCOL
    except OSError as exc:
        _say(f"failed: {exc}")
        return EXIT_FAILED
    finally:
        for server in servers:
            server.close()
        await mux.close()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError, MuxError, OSError):
            await running
        for server in servers:
            await server.wait_closed()
        for path in sockets.values():
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()
        writer.close()


async def _listen(mux: Mux, target: str, path: Path) -> asyncio.Server:
    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await mux.open(target, reader, writer)

    _unlink_stale(path)
    return await asyncio.start_unix_server(accepted, os.fspath(path))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m container.bridge", description=__doc__)
    parser.add_argument("--egress", action="store_true", help="also listen on the door to the web")
    options = parser.parse_args(argv)
    paths = ContainerPaths.from_env(os.environ)
    try:
        return asyncio.run(serve(paths, egress=options.egress))
    except KeyboardInterrupt:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
