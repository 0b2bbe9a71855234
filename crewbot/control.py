"""The operator's control socket: `crewbot config show|set` talks to the running bot through it.

A Unix socket at DATA_DIR/control.sock, mode 0600 before it listens, so only the bot's own user (and
root) can connect; the peer's uid (SO_PEERCRED) is who a change is logged as. JSON over HTTP, so
`curl --unix-socket` works too.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import struct
from pathlib import Path
from typing import Any

from aiohttp import web

from core.live_config import LiveConfig
from core.logging import get_logger
from core.settings import SettingsError

log = get_logger(__name__)

CONTROL_SOCKET_FILE = "control.sock"
SOCKET_MODE = 0o600
LISTEN_BACKLOG = 16
PEERCRED_FORMAT = "3i"  # struct ucred: pid, uid, gid


def control_socket_path(data_dir: Path) -> Path:
    return data_dir / CONTROL_SOCKET_FILE


def _peer(request: web.Request) -> str:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None:
        return "control socket (unknown user)"
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(PEERCRED_FORMAT))
        _, uid, _ = struct.unpack(PEERCRED_FORMAT, raw)
    except OSError:
        return "control socket (unknown user)"
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = "?"
    return f"{user} (uid {uid}) via control socket"


class ControlServer:
    def __init__(self, config: LiveConfig, path: Path) -> None:
        self._config = config
        self._path = path
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/config", self._show)
        app.router.add_post("/config", self._set)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()  # one bot per DATA_DIR (the lock): a socket left here is a dead one's
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self._path))
        os.chmod(self._path, SOCKET_MODE)  # before listen(): no one connects while it is wider
        sock.listen(LISTEN_BACKLOG)
        await web.SockSite(self._runner, sock).start()
        log.info("control_socket_listening", path=str(self._path))

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()

    async def _show(self, request: web.Request) -> web.Response:
        rows = await self._config.effective()
        return web.json_response(
            {"settings": [{"name": r.name, "value": r.value, "source": r.source.value, "live": r.live} for r in rows]}
        )

    async def _set(self, request: web.Request) -> web.Response:
        try:
            body: Any = await request.json()
            changes = body["changes"]
            if not isinstance(changes, dict) or not all(isinstance(v, str) for v in changes.values()):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return web.json_response({"errors": ['expected {"changes": {"NAME": "VALUE"}}']}, status=400)
        who = _peer(request)
        done: list[dict[str, str | None]] = []
        for name, value in changes.items():
            try:
                change = await self._config.set(str(name), value, who)
            except SettingsError as exc:
                return web.json_response({"errors": exc.lines, "applied": done}, status=400)
            done.append({"name": change.name, "old": change.old_value, "new": change.new_value})
        return web.json_response({"applied": done, "changed_by": who})
