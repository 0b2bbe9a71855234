"""Nothing under test (or benchmark) may connect beyond loopback, so no real model can be reached.

pydantic-ai's ALLOW_MODEL_REQUESTS stays on: the host makes every subagent's model steps itself
(runner/channel/model_step.py), over the run's Unix socket to its own LLM proxy, in nearly every subagent test.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any


def _check(sock: socket.socket, address: Any) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # Unix sockets: the Docker engine, the LLM proxy
    host = address[0]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ConnectionRefusedError(f"only loopback may be reached here, not {host!r}")


def install_loopback_guard() -> None:
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        _check(self, address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        _check(self, address)
        return real_connect_ex(self, address)

    socket.socket.connect = connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign,assignment]
