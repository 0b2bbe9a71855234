"""The hostile benchmark's container (`python -m bench.hostile_container`): the reviewer's reproduction, at
a run's maximum, from a process of its own.

For each command line (`{"socket": PATH, "attack": KIND}`) it sends, as fast as it can, each on a new
connection as the reproductions do, and answers with the statuses it got (`closed` once the host has
stopped the run and its socket is gone):
- `bodies`: a model step and a session as large as the run's caps allow with every part invalid (the most
  validation a body can cost), then every model step a run may ask for (its step limit plus the retries) as
  8 MB of `{}`, every session upload a run may make as 4 MB of `{}`, and a junk progress message and result
  of 512 KB;
- `preamble`: the second review's upload, its multipart preamble 8 MB of line feeds (one readline() a byte
  on the loop, before the fix), ATTEMPTS times;
- `deflate`: the same upload in 8 KB of `Content-Encoding: deflate` (inflated on the loop, before the fix:
  a 6.2 s stall), ATTEMPTS times;
- `chunks`: a 500 KB progress message as 1-byte HTTP chunks (3.1 MB of framing), ATTEMPTS times.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
import zlib
from collections import Counter
from typing import Any

from bench.stall_peer import Peer, failure, reply
from container.protocol import (
    FILES_PATH,
    MAX_RUN_BODY_BYTES,
    MAX_SESSION_BYTES,
    MAX_STEP_BYTES,
    MESSAGE_PATH,
    MODEL_PATH,
    RESULT_PATH,
    SESSION_PATH,
    TaskSpec,
)
from runner.channel.conversation_limits import ConversationLimits
from runner.channel.run_endpoint import EXTRA_MODEL_STEPS

ATTACKS = ("bodies", "preamble", "deflate", "chunks")
ATTEMPTS = 10  # a run is stopped at its third invalid request: the rest find its socket gone
STEPS = 55  # the default step limit (50) and the retries a run is allowed (runner/channel/run_endpoint.py)
SESSIONS = 3  # MAX_SESSION_UPLOADS
ANSWER_BYTES = 300
SOCKET_TIMEOUT_SECONDS = 120.0


def empty_objects(size: int, head: bytes, tail: bytes) -> bytes:
    count = (size - len(head) - len(tail)) // 3
    return head + b"{}," * count + b"{}" + tail


def at_the_caps() -> tuple[bytes, bytes]:
    """A step and a session as large as a run's conversation may be (its default task: no prior session,
    50 steps), every part invalid: what passes every cap and makes the host validate the most."""
    limits = ConversationLimits.for_task(TaskSpec(run_id="run-hostile", task="t", label="l"), EXTRA_MODEL_STEPS)
    per_message = limits.max_parts // limits.max_messages
    messages = [{"kind": "request", "parts": [{"part_kind": "user-prompt"}] * per_message}] * limits.max_messages
    return json.dumps({"messages": messages, "tools": []}).encode(), json.dumps(messages).encode()


def bodies() -> list[tuple[str, bytes]]:
    step = empty_objects(MAX_STEP_BYTES - 100, b'{"messages":[', b'],"tools":[]}')
    session = empty_objects(MAX_SESSION_BYTES - 100, b"[", b"]")
    message = empty_objects(MAX_RUN_BODY_BYTES - 100, b'{"message_id":"m-000001","text":"x","junk":[', b"]}")
    result = empty_objects(MAX_RUN_BODY_BYTES - 100, b'{"status":"completed","junk":[', b"]}")
    capped_step, capped_session = at_the_caps()
    return [
        (MODEL_PATH, capped_step),  # the run is stopped at its third invalid body: the costliest go first
        (SESSION_PATH, capped_session),
        *[(MODEL_PATH, step)] * STEPS,
        *[(SESSION_PATH, session)] * SESSIONS,
        (MESSAGE_PATH, message),
        (RESULT_PATH, result),
    ]


def upload(preamble: bytes) -> bytes:
    """The review's upload: a preamble, a valid meta part and an empty file part."""
    return preamble + (
        b'--b\r\nContent-Disposition: form-data; name="meta"\r\n\r\n{"upload_id": "u1", "name": "a.txt"}\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n\r\n\r\n--b--\r\n'
    )


def one_byte_chunks(body: bytes) -> bytes:
    return b"".join(b"1\r\n%c\r\n" % byte for byte in body) + b"0\r\n\r\n"


def requests(kind: str) -> list[tuple[str, list[str], bytes]]:
    """(target, extra headers, the body as sent) of one attack."""
    multipart = ["Content-Type: multipart/form-data; boundary=b"]
    if kind == "preamble":
        body = upload(b"\n" * (8 << 20))
        return [(FILES_PATH, [*multipart, f"Content-Length: {len(body)}"], body)] * ATTEMPTS
    if kind == "deflate":
        body = zlib.compress(upload(b"\n" * (8 << 20)), 9)
        headers = [*multipart, "Content-Encoding: deflate", f"Content-Length: {len(body)}"]
        return [(FILES_PATH, headers, body)] * ATTEMPTS
    if kind == "chunks":
        message = empty_objects(MAX_RUN_BODY_BYTES - 100, b'{"message_id":"m-000001","text":"x","junk":[', b"]}")
        return [(MESSAGE_PATH, ["Transfer-Encoding: chunked"], one_byte_chunks(message))] * ATTEMPTS
    return [(target, [f"Content-Length: {len(body)}"], body) for target, body in bodies()]


def post(path: str, target: str, headers: list[str], body: bytes) -> str:
    """One request as the reproduction sends it; the status line's code, or what went wrong."""
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(SOCKET_TIMEOUT_SECONDS)
            sock.connect(path)
            head = "\r\n".join([f"POST {target} HTTP/1.1", "Host: x", *headers, "Connection: close"]) + "\r\n\r\n"
            sock.sendall(head.encode() + body)
            answer = sock.recv(ANSWER_BYTES)
    except (FileNotFoundError, ConnectionRefusedError):
        return "closed"  # the run was stopped and its socket removed
    except OSError as exc:
        return type(exc).__name__  # the host hung up mid-body (a refusal before the body was read)
    parts = answer.split(b" ", 2)
    return parts[1].decode() if len(parts) > 1 else "no answer"


def attack(path: str, prepared: list[tuple[str, list[str], bytes]]) -> dict[str, Any]:
    started = time.monotonic()
    statuses: Counter[str] = Counter()
    for target, headers, body in prepared:
        statuses[f"{target} {post(path, target, headers, body)}"] += 1
    return {"statuses": dict(statuses), "started": started, "finished": time.monotonic()}


async def _loop() -> None:
    prepared = {kind: requests(kind) for kind in ATTACKS}
    reply({"ready": True, "requests": {kind: len(sent) for kind, sent in prepared.items()}})
    while line := await asyncio.to_thread(sys.stdin.readline):
        try:
            command = json.loads(line)
            answer = await asyncio.to_thread(attack, command["socket"], prepared[command["attack"]])
        except Exception as exc:
            answer = failure(exc)
        reply(answer)


def hostile_container() -> Peer:
    return Peer("hostile container", __name__)


if __name__ == "__main__":
    asyncio.run(_loop())
