"""runner/channel/bounded_json.py: a body is measured before it is parsed, never under-counted, and a hostile one is
refused without being built."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from container.contract import MAX_STEP_BYTES
from runner.channel import bounded_json
from runner.channel.bounded_json import MAX_DEPTH_PASSES, BodyRefused, ShapeScanner, check_shape, first_error

MIB = 1024 * 1024
# Tricky strings: quotes, backslashes and brackets inside strings must not count as structure.
TEXT = st.text(alphabet=st.sampled_from(['"', "\\", "[", "]", "{", "}", ",", ":", "a", "é", "\n", " "]), max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5), max_leaves=40
)


def count_values(value: Any) -> int:
    if isinstance(value, list):
        return 1 + sum(count_values(item) for item in value)
    if isinstance(value, dict):
        return 1 + sum(count_values(item) for item in value.values())
    return 1


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(item) for item in value.values()), default=0)
    return 0


@settings(max_examples=400, deadline=None)
@given(VALUES, st.booleans())
def test_values_are_never_under_counted_and_at_most_doubled(value: Any, ascii_only: bool) -> None:
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    actual = count_values(value)
    if actual > 1:
        with pytest.raises(BodyRefused, match="values"):
            check_shape(body, actual - 1)
    check_shape(body, 2 * actual + 1)  # passes: an empty container counts twice at most


@settings(max_examples=300, deadline=None)
@given(VALUES, st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=50))
def test_a_body_measured_piece_by_piece_counts_as_a_whole(value: Any, sizes: list[int]) -> None:
    body = json.dumps({"v": value, "s": '\\"\\\\"'}).encode()  # escapes that pieces may split
    pieces = []
    start = 0
    for size in sizes * len(body):
        if start >= len(body):
            break
        pieces.append(body[start : start + size])
        start += size

    def measure(chunks: list[bytes], max_values: int) -> bool:
        scanner = ShapeScanner(max_values)
        try:
            for chunk in chunks:
                scanner.feed(chunk)
            scanner.finish()
        except BodyRefused:
            return False
        return True

    for max_values in (count_values(value), 2 * count_values(value) + 4):
        assert measure(pieces, max_values) == measure([body], max_values)
    assert measure(pieces, 2 * count_values(value) + 4)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=3 * MAX_DEPTH_PASSES), st.booleans())
def test_nesting_is_capped(levels: int, alternate: bool) -> None:
    value: Any = 1
    for level in range(levels):
        value = {"k": value} if alternate and level % 2 else [value]
    body = json.dumps(value).encode()
    assert depth(value) == levels
    if levels <= MAX_DEPTH_PASSES:
        check_shape(body, 10_000)
    elif levels > 2 * MAX_DEPTH_PASSES:
        with pytest.raises(BodyRefused, match="nested more than"):
            check_shape(body, 10_000)


def hostile_bodies() -> dict[str, bytes]:
    """The reviewer's bodies and their cousins, each just under the 8 MB a model step may be."""
    size = MAX_STEP_BYTES - 100
    return {
        "empty objects": b'{"messages":[' + b"{}," * ((size - 40) // 3) + b'{}],"tools":[]}',
        "empty strings": b"[" + b'"",' * ((size - 10) // 3) + b'""]',
        "numbers": b"[" + b"1," * (size // 2) + b"1]",
        "keys": b"{" + b'"aaaaaaa":1,' * (size // 12) + b'"b":1}',
        "nesting": b"[" * (size // 2) + b"]" * (size // 2),
    }


@pytest.mark.parametrize("name", list(hostile_bodies()))
def test_a_hostile_body_is_refused_before_anything_is_built(name: str) -> None:
    body = hostile_bodies()[name]
    tracemalloc.start()
    try:
        with pytest.raises(BodyRefused):
            bounded_json.load(body, 200_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Parsed, the empty objects were 2.8 million dicts: gigabytes. Measured, at most two copies of the body.
    assert peak < 3 * len(body), f"{peak / MIB:.1f} MiB to refuse {len(body) / MIB:.1f} MiB"


def test_a_long_string_full_of_escapes_passes_as_one_value() -> None:
    text = '\\"quoted\\" {[,]} ' * 200_000
    body = json.dumps({"content": text, "n": [1, 2]}).encode()
    assert len(body) > 4 * MIB
    assert bounded_json.load(body, 10) == {"content": text, "n": [1, 2]}


@pytest.mark.parametrize("body", [b'{"a": "not closed}', b"[1, 2}", b"[[1]", b"{}}"])
def test_broken_json_is_refused_by_the_scan_or_the_parser(body: bytes) -> None:
    with pytest.raises(BodyRefused, match="not JSON"):
        bounded_json.load(body, 100)


class Point(BaseModel):
    x: int
    y: int


def test_validation_names_the_first_error_and_counts_the_rest() -> None:
    with pytest.raises(BodyRefused) as refused:
        bounded_json.validate(Point, b'{"x": "one", "y": "two"}', 10)
    assert str(refused.value) == "x: Input should be a valid integer, unable to parse string as an integer (and 1 more)"


def test_many_errors_are_counted_not_read() -> None:
    class Many(BaseModel):
        items: list[int]

    with pytest.raises(ValidationError) as raised:
        Many.model_validate({"items": ["x"] * 1000})
    assert first_error(raised.value) == "1000 errors"
