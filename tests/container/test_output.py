"""Output capping: the streaming collector agrees with the one-shot cap, however the bytes arrive."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from container.output import OutputCollector, cap_text


def test_cap_text_keeps_short_text_whole() -> None:
    assert cap_text("hello", 5) == "hello"


def test_cap_text_keeps_head_and_tail() -> None:
    assert cap_text("abcdefghij", 4) == "ab\n[... 6 characters cut ...]\nij"


@given(
    text=st.text(max_size=300),
    cap_chars=st.integers(min_value=0, max_value=120),
    cuts=st.lists(st.integers(min_value=0, max_value=1_200), max_size=6),
)
def test_collector_matches_cap_text_for_any_chunking(text: str, cap_chars: int, cuts: list[int]) -> None:
    data = text.encode("utf-8")
    collector = OutputCollector(cap_chars)
    start = 0
    for cut in sorted(cut for cut in cuts if cut <= len(data)):
        collector.feed(data[start:cut])  # may split a multi-byte character
        start = cut
    collector.feed(data[start:])

    assert collector.text() == cap_text(text, cap_chars)
    assert collector.total_chars == len(text)
