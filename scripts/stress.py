"""Run pytest several times in a row with every core kept busy: how races that pass on an idle machine show.

    python scripts/stress.py [--rounds N] [--load-processes N] [-- PYTEST ARGS]

`make test-stress` runs the Docker tests this way (not part of `make test`). Each round is a fresh pytest;
the load is one busy process per core (nice 10, so the engine and the tests still get their share) for the
whole run. Prints each round's outcome and exits non-zero if any round failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time

DEFAULT_ROUNDS = 3
LOAD_NICENESS = 10


def burn() -> None:
    os.nice(LOAD_NICENESS)
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--load-processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("pytest_args", nargs="*", help="given to pytest as they are (after --)")
    args = parser.parse_args()

    load = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.load_processes)]
    for process in load:
        process.start()
    outcomes: list[tuple[int, int, float]] = []
    try:
        for round_number in range(1, args.rounds + 1):
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "pytest", *args.pytest_args], check=False)
            outcomes.append((round_number, done.returncode, time.monotonic() - started))
            print(f"stress: round {round_number}/{args.rounds}: exit {done.returncode}", flush=True)
    finally:
        for process in load:
            process.terminate()  # our own children
        for process in load:
            process.join()
    for round_number, code, seconds in outcomes:
        print(f"stress: round {round_number}: {'passed' if code == 0 else 'FAILED'} in {seconds:.0f} s")
    return 0 if all(code == 0 for _, code, _ in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
