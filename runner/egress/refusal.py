"""A request the door turns down, and the short HTTP answer that tells the client why.

A refusal carries two texts: its reason, which the client reads, names the rule that refused and what the
client itself asked for; its detail, for the operator's records and logs, may add what only the host knows
(the address a name resolved to, that an address is the host's own). The client is never told the detail:
the door would be an oracle for the host's resolver and addresses."""

from __future__ import annotations

from http import HTTPStatus

from container.text import one_line

MAX_REASON_CHARS = 300

BAD_REQUEST = 400  # malformed: not a proxy request the door can read
FORBIDDEN = 403  # policy: the rules do not allow it
TIMEOUT = 408  # the request head did not arrive in time
TOO_MANY = 429  # over the run's connection cap or its lookups
BAD_GATEWAY = 502  # the name did not resolve, or the address did not answer
GATEWAY_TIMEOUT = 504  # resolving or connecting took too long


class Refused(Exception):
    """Why the door will not carry this connection: an HTTP status, one line for the client and one (the same,
    unless given) for the operator."""

    def __init__(self, status: int, reason: str, detail: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        # Each goes into an HTTP body, an event or a log line.
        self.reason = one_line(reason, MAX_REASON_CHARS)
        self.detail = self.reason if detail is None else one_line(detail, MAX_REASON_CHARS)


def answer(status: int, reason: str) -> bytes:
    """A complete HTTP/1.1 response that closes the connection, its body the reason."""
    body = (one_line(reason, MAX_REASON_CHARS) + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body
