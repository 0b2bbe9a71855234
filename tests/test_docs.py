"""The README documents every setting, and the two commands it promises exist."""

from __future__ import annotations

import re
from pathlib import Path

from core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def test_readme_lists_every_setting() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [f.alias for f in Settings.model_fields.values() if f.alias and f"`{f.alias}`" not in readme]
    assert missing == []


def test_readme_commands_are_make_targets() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("run", "test", "bench"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, re.MULTILINE)
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
