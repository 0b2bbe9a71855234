"""`make lint`: fail on a Python module over MAX_MODULE_LINES lines (small modules with one job each)."""

from __future__ import annotations

import sys
from pathlib import Path

MAX_MODULE_LINES = 400
CHECKED = ("core", "bot", "runner", "container", "crewbot", "bench", "tests", "scripts")


def oversized(root: Path) -> list[tuple[Path, int]]:
    found: list[tuple[Path, int]] = []
    for top in CHECKED:
        for path in sorted((root / top).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_MODULE_LINES:
                found.append((path.relative_to(root), lines))
    return found


def main() -> int:
    found = oversized(Path(__file__).resolve().parent.parent)
    for path, lines in found:
        print(f"{path}: {lines} lines, over the {MAX_MODULE_LINES}-line limit: split it by what its parts do")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
