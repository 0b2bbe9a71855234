"""Session continuity in the container: the history a task brings in, and the bounded one sent back."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from container.contract import MAX_SESSION_BYTES
from container.session import dump_history, load_history


def exchange(number: int, size: int = 10) -> list[Any]:
    """Four messages as the channel carries them: pydantic-ai's JSON."""
    return as_json_values(
        [
            ModelRequest(parts=[UserPromptPart(content=f"prompt {number} " + "p" * size)]),
            ModelResponse(
                parts=[ToolCallPart(tool_name="bash", args={"command": "ls"}, tool_call_id=f"call-{number}")]
            ),
            ModelRequest(parts=[ToolReturnPart(tool_name="bash", content="a.txt", tool_call_id=f"call-{number}")]),
            ModelResponse(parts=[TextPart(content=f"answer {number}")]),
        ]
    )


def as_json_values(messages: list[ModelMessage]) -> list[Any]:
    values: list[Any] = json.loads(ModelMessagesTypeAdapter.dump_json(messages))
    return values


def test_no_history_is_an_empty_one() -> None:
    assert load_history([]) == ([], None)


def test_history_from_the_task_round_trips() -> None:
    messages = exchange(1) + exchange(2)

    history, dropped = load_history(messages)

    assert dropped is None
    assert history == messages
    assert ModelMessagesTypeAdapter.validate_python(history)  # what the host reads it as


def test_unusable_history_is_dropped_with_the_reason() -> None:
    history, dropped = load_history([{"kind": "nonsense"}, "text", None])

    assert history == []
    assert dropped == "the prior session is not a message history; starting fresh"


def test_dump_keeps_a_history_that_fits_whole() -> None:
    messages = exchange(1) + exchange(2)
    assert json.loads(dump_history(messages)) == messages
    assert dump_history([]) == b"[]"


def test_dump_drops_the_oldest_messages_until_it_fits() -> None:
    messages = exchange(1, size=3_000) + exchange(2, size=3_000) + exchange(3, size=3_000)
    whole = len(dump_history(messages))

    data = dump_history(messages, max_bytes=whole // 2)

    assert len(data) <= whole // 2
    kept = json.loads(data)
    assert 0 < len(kept) < len(messages)
    assert kept == messages[-len(kept) :]


def test_dump_of_a_last_message_over_the_limit_is_empty() -> None:
    messages = [*exchange(1), *as_json_values([ModelResponse(parts=[TextPart(content="x" * MAX_SESSION_BYTES)])])]

    assert dump_history(messages) == b"[]"


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=12),
    max_bytes=st.integers(min_value=0, max_value=3_000),
)
def test_dump_fits_and_is_a_suffix_for_any_limit(sizes: list[int], max_bytes: int) -> None:
    messages = [message for number, size in enumerate(sizes) for message in exchange(number, size)]

    data = dump_history(messages, max_bytes=max_bytes)

    if data == b"[]" and max_bytes < 2:
        return  # nothing fits, not even an empty list: the host then keeps no session
    assert len(data) <= max_bytes
    kept = json.loads(data)
    assert kept == messages[len(messages) - len(kept) :]
