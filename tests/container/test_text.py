from __future__ import annotations

from container.text import ELLIPSIS, one_line


def test_line_breaks_controls_and_runs_of_spaces_become_one_space() -> None:
    assert one_line("  first\r\nsecond\x00\x1b[31m\tthird\u2028fourth\x85  ") == "first second [31m third fourth"


def test_format_characters_and_undecodable_bytes_do_not_pass() -> None:
    # A right-to-left override could make a text read backwards; a surrogate could not be encoded.
    assert one_line("evil\u202eexe.\udcff") == "evil exe."


def test_a_text_within_the_bound_is_kept_whole() -> None:
    assert one_line("x" * 10, 10) == "x" * 10


def test_a_cut_text_ends_in_an_ellipsis_within_the_bound() -> None:
    cut = one_line("word " * 100, 20)
    assert len(cut) == 20 and cut.endswith(ELLIPSIS) and cut.startswith("word word")


def test_the_bound_counts_the_flattened_text() -> None:
    assert one_line("a\n\n\n\nb", 3) == "a b"


def test_no_room_is_no_text() -> None:
    assert one_line("anything", 0) == ""


def test_nothing_printable_is_empty() -> None:
    assert one_line("\n\t\x00 ") == ""
