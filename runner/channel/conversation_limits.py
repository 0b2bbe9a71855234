"""How big a run's conversation may be: the caps a model step or a session is checked against before it is
validated as pydantic-ai messages (which costs a few microseconds per part, holding the GIL).

The caps follow from the run's own task: the prior session it was given, plus a request and a response
for each step it may take. A conversation over them was not written by the agent's loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from container.protocol import TaskSpec

MESSAGES_PER_STEP = 2  # the model's response and the request with the tools' returns
FIRST_MESSAGES = 2  # the opening request, and one of slack for a step retried after a lost connection
MAX_PARTS_PER_MESSAGE = 64  # text, thinking and tool calls of one response, or the returns of one request
PARTS_PER_MESSAGE_ON_AVERAGE = 8
# JSON values: the tools' schemas and the task take a fixed share; each message its parts, their fields,
# a tool call's arguments.
BASE_VALUES = 20_000
VALUES_PER_MESSAGE = 200


class ConversationRefused(ValueError):
    """Over a cap; the message names it."""


@dataclass(frozen=True, slots=True)
class ConversationLimits:
    max_messages: int
    max_parts: int

    @property
    def max_values(self) -> int:
        return BASE_VALUES + self.max_messages * VALUES_PER_MESSAGE

    @classmethod
    def for_task(cls, spec: TaskSpec, extra_steps: int) -> ConversationLimits:
        messages = len(spec.history) + FIRST_MESSAGES + MESSAGES_PER_STEP * (spec.max_steps + extra_steps)
        return cls(max_messages=messages, max_parts=messages * PARTS_PER_MESSAGE_ON_AVERAGE)


def check_conversation(messages: Any, limits: ConversationLimits) -> None:
    """ConversationRefused unless `messages` (parsed JSON, not yet validated) is a list within the caps.
    What is not a list here is left for validation to name."""
    if not isinstance(messages, list):
        return
    if len(messages) > limits.max_messages:
        raise ConversationRefused(f"{len(messages)} messages, over this run's limit of {limits.max_messages}")
    parts = 0
    for message in messages:
        listed = message.get("parts") if isinstance(message, dict) else None
        if not isinstance(listed, list):
            continue
        if len(listed) > MAX_PARTS_PER_MESSAGE:
            raise ConversationRefused(f"a message of {len(listed)} parts, over the limit of {MAX_PARTS_PER_MESSAGE}")
        for part in listed:
            content = part.get("content") if isinstance(part, dict) else None
            # A user prompt's content may be a list of items, each validated like a part.
            parts += 1 + (len(content) if isinstance(content, list) else 0)
        if parts > limits.max_parts:
            raise ConversationRefused(f"over this run's limit of {limits.max_parts} message parts")
