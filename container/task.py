"""The task as the agent reads it and the result it reports: plain dataclasses over the channel's JSON.

The host validates both ends with its typed models (container/protocol.py); the agent only checks what it
relies on, so it starts without pydantic.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


class TaskInvalid(ValueError):
    """The task the channel handed over is not usable; the message says which field."""


@dataclass(frozen=True, slots=True)
class Task:
    run_id: str
    task: str
    label: str
    context: list[str] = field(default_factory=list)
    history: list[Any] = field(default_factory=list)  # the prior session: pydantic-ai messages as JSON
    max_steps: int = 50
    bash_timeout_seconds: float = 120.0
    output_cap_chars: int = 16_000

    @classmethod
    def from_json(cls, data: bytes) -> Task:
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise TaskInvalid(f"the task is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise TaskInvalid("the task is not a JSON object")
        return cls(
            run_id=_typed(raw, "run_id", str),
            task=_typed(raw, "task", str),
            label=_typed(raw, "label", str),
            context=[str(line) for line in _typed(raw, "context", list, [])],
            history=_typed(raw, "history", list, []),
            max_steps=_typed(raw, "max_steps", int, 50),
            bash_timeout_seconds=float(_typed(raw, "bash_timeout_seconds", (int, float), 120.0)),
            output_cap_chars=_typed(raw, "output_cap_chars", int, 16_000),
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    status: Literal["completed", "failed"]
    result: str = ""
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()


_MISSING = object()


def _typed(raw: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
    value = raw.get(name, default)
    if value is _MISSING:
        raise TaskInvalid(f"the task has no {name}")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TaskInvalid(f"the task's {name} is not a {getattr(kind, '__name__', kind)}")
    return value
