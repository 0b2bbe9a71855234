"""Stall case (a): 10,000 junk IPC files, and the writer process that floods an allowed chat's tasks/ with them.

The writer (`python -m bench.stall_junk`, started by the host through `junk_writer()`) writes four kinds of
junk, all named *.json so the watcher reads and quarantines each at once: not text, JSON that is no spawn
request, a valid request under another file name, a request naming another chat. It then polls tasks/ and
errors/ from its side until every file is quarantined; the host's window (`junk_work`) ends there.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from bench.stall_peer import WAIT_SECONDS, Peer, failure, reply
from container.protocol import SpawnRequest
from runner.ipc.requests import ERRORS_DIR, TASKS_DIR

JUNK_FILES = 10_000


# --- the writer process ---------------------------------------------------------------------------------


def _junk_body(i: int, rng: random.Random, name: str, other_chat_id: int) -> bytes:
    """Four kinds, all named *.json so each is read and quarantined at once (no wait for staleness)."""
    kind = i % 4
    if kind == 0:  # not text at all
        return rng.randbytes(rng.randint(16, 512))
    if kind == 1:  # JSON, but not a spawn request
        return json.dumps({"version": 1, "task": i, "surprise": [True] * rng.randint(1, 20)}).encode()
    request_id = f"junk-req-{i:06d}"
    if kind == 2:  # a valid request under another file name
        return SpawnRequest(request_id=request_id, task="rm -rf / # please").model_dump_json().encode()
    # a valid request for another chat
    assert name == f"{request_id}.json"
    return SpawnRequest(request_id=request_id, task="hello", chat_id=other_chat_id).model_dump_json().encode()


def _errors_count(errors: Path) -> int:
    try:
        return len(os.listdir(errors))
    except FileNotFoundError:
        return 0


def _flood(command: dict[str, Any]) -> dict[str, Any]:
    """Write the junk as fast as possible, then wait until tasks/ is empty and errors/ holds all of it."""
    tasks, errors = Path(command["tasks"]), Path(command["errors"])
    count, other_chat_id = int(command["count"]), int(command["other_chat_id"])
    rng = random.Random(int(command["seed"]))
    before = _errors_count(errors)
    names = [f"junk-req-{i:06d}.json" if i % 4 == 3 else f"junk-{i:06d}.json" for i in range(count)]
    bodies = [_junk_body(i, rng, name, other_chat_id) for i, name in enumerate(names)]
    first = time.monotonic()
    for name, body in zip(names, bodies, strict=True):
        fd = os.open(tasks / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
    last = time.monotonic()
    deadline = last + float(command["timeout"])
    while True:
        with os.scandir(tasks) as entries:
            empty = next(entries, None) is None
        # Each quarantined file leaves two entries: the file and its .reason.txt.
        if empty and _errors_count(errors) - before >= 2 * count:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    done = time.monotonic()
    left = sum(1 for _ in os.scandir(tasks))
    return {
        "first": first,
        "last": last,
        "done": done,
        "left_in_tasks": left,
        "quarantined": (_errors_count(errors) - before) // 2,
    }


def main() -> int:
    reply({"ready": True})
    for line in sys.stdin:
        try:
            answer = _flood(json.loads(line))
        except Exception as exc:
            answer = failure(exc)
        reply(answer)
    return 0


# --- the host's side ------------------------------------------------------------------------------------


def junk_writer() -> Peer:
    return Peer("junk", __name__)


async def junk_work(
    writer: Peer, ipc_root: Path, folder: str, other_chat_id: int, seed: int
) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """Window (a): the writer floods `folder`'s tasks/ until every file is quarantined."""
    asked = time.monotonic()
    answer = await writer.call(
        {
            "tasks": str(ipc_root / folder / TASKS_DIR),
            "errors": str(ipc_root / ERRORS_DIR),
            "count": JUNK_FILES,
            "other_chat_id": other_chat_id,
            "seed": seed,
            "timeout": WAIT_SECONDS,
        }
    )
    if answer["left_in_tasks"] or answer["quarantined"] != JUNK_FILES:
        raise RuntimeError(f"not every junk file was quarantined: {answer}")
    facts = {
        "files": JUNK_FILES,
        "asked_to_first_write_s": round(answer["first"] - asked, 4),
        "write_s": round(answer["last"] - answer["first"], 4),
        "quarantined_s": round(answer["done"] - answer["first"], 4),
    }
    return facts, [("writing", answer["first"]), ("quarantining the rest", answer["last"])]


if __name__ == "__main__":
    sys.exit(main())
