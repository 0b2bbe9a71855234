"""File names made safe, never a reason to refuse: what a chat member or a subagent called a file becomes one
plain directory entry, and names that would repeat in one run are numbered."""

from __future__ import annotations

import pytest

from container.contract import MAX_FILE_NAME_BYTES
from container.file_names import FALLBACK_NAME, numbered, safe_file_name, unique_names


@pytest.mark.parametrize(
    ("given", "safe"),
    [
        ("sales.csv", "sales.csv"),
        ("../../evil.csv", "evil.csv"),
        ("..\\..\\windows\\evil.csv", "evil.csv"),
        ("/etc/passwd", "passwd"),
        ("a\x00b.txt", "a_b.txt"),
        ("line\nbreak.txt", "line_break.txt"),
        ("..", FALLBACK_NAME),
        ("...", FALLBACK_NAME),
        (".", FALLBACK_NAME),
        ("", FALLBACK_NAME),
        ("   ", FALLBACK_NAME),
        ("._.", FALLBACK_NAME),
        (".bashrc", "bashrc"),  # never hidden
        ("evil\u202egnp.exe", "evilgnp.exe"),  # a right-to-left override cannot disguise the extension
        ("Отчёт за март.pdf", "Отчёт за март.pdf"),  # people's names stay readable
        ('a:b*c?"d<e>f|g.txt', "a_b_c__d_e_f_g.txt"),
    ],
)
def test_a_name_becomes_one_plain_directory_entry(given: str, safe: str) -> None:
    assert safe_file_name(given) == safe


@pytest.mark.parametrize("given", ["x" * 300 + ".csv", "ж" * 300 + ".tar.gz", "x" * 300, "😀" * 100 + ".png"])
def test_a_long_name_is_cut_to_fit_one_entry_keeping_its_extension(given: str) -> None:
    safe = safe_file_name(given)
    assert len(safe.encode()) <= MAX_FILE_NAME_BYTES
    assert "." not in given or safe.endswith(given[given.rindex(".") :])
    assert safe.encode().decode() == safe  # never a cut UTF-8 sequence


def test_repeated_names_in_one_run_are_numbered_ignoring_case() -> None:
    assert unique_names(["data.csv", "../data.csv", "DATA.csv", "notes", "notes"]) == [
        "data.csv",
        "data (2).csv",
        "DATA (3).csv",
        "notes",
        "notes (2)",
    ]


def test_a_numbered_long_name_still_fits() -> None:
    long = safe_file_name("y" * 300 + ".csv")
    assert len(numbered(long, 12).encode()) <= MAX_FILE_NAME_BYTES
    assert numbered(long, 12).endswith(" (12).csv")
