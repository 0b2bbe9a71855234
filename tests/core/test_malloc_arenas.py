"""The arena limit, read back from glibc itself (malloc_info lists one <heap> per arena), in a fresh interpreter
whose threads allocate at once; and an operator's MALLOC_ARENA_MAX left alone."""

from __future__ import annotations

import os
import subprocess
import sys

THREADS = 6
# Threads allocating blocks past Python's small-object allocator (512 bytes) at the same time, then glibc's
# own report of its arenas on stdout.
PROBE = (
    "import ctypes, sys, threading\n"
    "from core.malloc_arenas import limit_malloc_arenas\n"
    "print(limit_malloc_arenas(int(sys.argv[1])) if sys.argv[1] != '0' else 'unlimited', flush=True)\n"
    "def work():\n"
    "    for _ in range(20_000):\n"
    "        blocks = [bytearray(2_000) for _ in range(20)]\n"
    f"threads = [threading.Thread(target=work) for _ in range({THREADS})]\n"
    "for t in threads: t.start()\n"
    "for t in threads: t.join()\n"
    "libc = ctypes.CDLL('libc.so.6')\n"
    "libc.fdopen.restype = ctypes.c_void_p\n"
    "out = ctypes.c_void_p(libc.fdopen(1, b'w'))\n"
    "libc.malloc_info(0, out)\n"
    "libc.fflush(out)\n"
)


def _arenas(limit: int, **env: str) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(limit)],
        env={**{k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    first, _, rest = done.stdout.partition("\n")
    return first, rest.count("<heap nr=")


def test_threads_share_the_arenas_asked_for() -> None:
    assert _arenas(0)[1] > 2  # without the limit, threads allocating at once get arenas of their own
    said, arenas = _arenas(2)
    assert said == "True" and 1 <= arenas <= 2
    assert _arenas(1) == ("True", 1)


def test_an_operators_setting_is_left_alone() -> None:
    said, arenas = _arenas(1, MALLOC_ARENA_MAX="3")
    assert said == "False"
    assert arenas > 1
