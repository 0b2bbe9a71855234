"""A subagent's message history as pydantic-ai reads it: validated, stripped of instructions, trimmed.

Its own module so that pydantic-ai is imported when the first session is checked, not at the host's start.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import ValidationError
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    SystemPromptPart,
    UserPromptPart,
)

from runner.channel import bounded_json
from runner.channel.bounded_json import BodyRefused
from runner.channel.conversation_limits import ConversationLimits, ConversationRefused, check_conversation


class HistoryInvalid(ValueError):
    """Not a pydantic-ai message history; the message says how many errors."""


def trim(messages: list[ModelMessage], max_messages: int) -> list[ModelMessage]:
    """The last `max_messages`, starting at a user prompt so no tool result is left without its call."""
    if max_messages <= 0:
        return []
    kept = messages[-max_messages:]
    for index, message in enumerate(kept):
        if isinstance(message, ModelRequest) and any(isinstance(part, UserPromptPart) for part in message.parts):
            return kept[index:]
    return []


def without_instructions(messages: list[ModelMessage], notes: str = "") -> list[ModelMessage]:
    """The history minus system prompts and instructions: the next run gets ours, never ones a run wrote
    into its own session (that would turn a one-off prompt injection into a standing one). Minus the chat's
    `notes` the run was handed as a prompt part of their own too: the next run gets them as they are then, and
    one erased since leaves no copy in a saved session."""
    kept: list[ModelMessage] = []
    for message in messages:
        if isinstance(message, ModelRequest):
            parts = [
                part
                for part in message.parts
                if not isinstance(part, SystemPromptPart)
                and not (notes and isinstance(part, UserPromptPart) and part.content == notes)
            ]
            if not parts:
                continue
            message = replace(message, parts=parts, instructions=None)
        kept.append(message)
    return kept


def clean_history(data: bytes, max_messages: int, limits: ConversationLimits, notes: str = "") -> bytes:
    """`data` validated as a history, re-encoded without instructions and trimmed. Its shape and size are
    checked against `limits` first, so a hostile upload costs milliseconds, not seconds."""
    try:
        check_conversation(bounded_json.load(data, limits.max_values), limits)
    except (BodyRefused, ConversationRefused) as exc:
        raise HistoryInvalid(f"not a message history: {exc}") from None
    try:
        messages = ModelMessagesTypeAdapter.validate_json(data)
    except ValidationError as exc:
        raise HistoryInvalid(f"not a message history ({exc.error_count()} errors)") from None
    return ModelMessagesTypeAdapter.dump_json(trim(without_instructions(messages, notes), max_messages))
