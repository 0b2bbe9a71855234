"""The README stays a front page (what it is, the two commands, the console, a map of docs/), the docs cover
every setting and every page is on the map and in the site's nav, and the commands they promise exist."""

from __future__ import annotations

import re
from pathlib import Path

from core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300
TRANSCRIPT = re.compile(r"^```\n(crewbot console: .*?)^```$", re.MULTILINE | re.DOTALL)


def read(relative: str) -> str:
    return (ROOT / relative).read_text(encoding="utf-8")


def pages() -> list[str]:
    return sorted(path.name for path in (ROOT / "docs").glob("*.md"))


def test_the_readme_is_a_front_page() -> None:
    readme = read("README.md")
    assert len(readme.splitlines()) <= README_MAX_LINES
    for heading in ("## Before you start", "## Two commands", "## Documentation"):
        assert heading in readme


def test_the_readme_maps_every_page_and_the_site_lists_them() -> None:
    readme, nav = read("README.md"), read("mkdocs.yml")
    assert [page for page in pages() if page != "index.md" and f"(docs/{page})" not in readme] == []
    assert [page for page in pages() if f": {page}" not in nav] == []


def test_the_console_transcript_is_the_same_in_the_readme_and_the_install_page() -> None:
    readme = TRANSCRIPT.search(read("README.md"))
    install = TRANSCRIPT.search(read("docs/install.md"))
    assert readme is not None and install is not None
    assert readme.group(1) == install.group(1)


def test_the_settings_reference_lists_every_setting() -> None:
    reference = read("docs/settings.md")
    missing = [f.alias for f in Settings.model_fields.values() if f.alias and f"### `{f.alias}`" not in reference]
    assert missing == []


def test_promised_commands_are_make_targets() -> None:
    readme, install, makefile = read("README.md"), read("docs/install.md"), read("Makefile")
    for target in ("run", "test"):
        assert f"make {target}" in readme
    for target in ("run", "test", "bench", "docs"):
        assert f"make {target}" in readme + install
        assert re.search(rf"^{target}:", makefile, re.MULTILINE)
    assert "make test" in read(".ci/run")
