"""The tools as the model is offered them, read from the Toolbox's own signatures and docstrings, and
a tool call's arguments checked against them before the tool runs.

The docstrings are Google style: the text before `Args:` is the tool's description, each `name: text`
under it an argument's. Every argument is a string, or a list of strings where the signature says `list[str]`;
one with a default is optional.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from typing import Any

from container.tools import Toolbox

TOOL_NAMES = (
    "bash",
    "read_file",
    "write_file",
    "edit_file",
    "list_files",
    "send_message",
    "send_file",
    "ask_chat",
)
LIST_ANNOTATION = "list[str]"  # an argument annotated so (`list[str] | None`) takes a JSON array of strings
_ARG_LINE = re.compile(r"^(\w+): (.*)$")


class ArgumentsInvalid(ValueError):
    """The model's arguments do not fit the tool; the message says how, for the model to fix them."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    arguments: dict[str, str]  # name -> description, in the signature's order
    required: tuple[str, ...]
    lists: frozenset[str] = frozenset()  # the arguments that take a list of strings

    def as_json(self) -> dict[str, Any]:
        """As the host's ToolSpec takes it: the arguments as a JSON schema."""
        properties = {
            name: (
                {"type": "array", "items": {"type": "string"}, "description": text}
                if name in self.lists
                else {"type": "string", "description": text}
            )
            for name, text in self.arguments.items()
        }
        schema = {"type": "object", "properties": properties, "required": list(self.required)}
        return {
            "name": self.name,
            "description": self.description,
            "parameters": schema | {"additionalProperties": False},
        }

    def check(self, raw: object) -> dict[str, Any]:
        """The arguments of a call (a JSON object, or its text), or ArgumentsInvalid."""
        if raw is None or raw == "":
            raw = {}
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise ArgumentsInvalid(f"the arguments are not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ArgumentsInvalid("the arguments must be a JSON object")
        problems = [f"unknown argument {name!r}" for name in raw if name not in self.arguments]
        problems += [f"missing argument {name!r}" for name in self.required if name not in raw]
        problems += [
            f"argument {name!r} must be a list of strings"
            if name in self.lists
            else f"argument {name!r} must be a string"
            for name, value in raw.items()
            if name in self.arguments and not self._fits(name, value)
        ]
        if problems:
            raise ArgumentsInvalid("; ".join(problems))
        return {str(name): value for name, value in raw.items()}

    def _fits(self, name: str, value: object) -> bool:
        if name in self.lists:
            return value is None or (isinstance(value, list) and all(isinstance(item, str) for item in value))
        return isinstance(value, str)


def tool_specs() -> dict[str, ToolSpec]:
    return {name: _spec(name) for name in TOOL_NAMES}


def _spec(name: str) -> ToolSpec:
    method = getattr(Toolbox, name)
    description, argument_texts = _parse_docstring(inspect.getdoc(method) or "")
    parameters = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
    arguments = {p.name: argument_texts.get(p.name, "") for p in parameters}
    required = tuple(p.name for p in parameters if p.default is inspect.Parameter.empty)
    lists = frozenset(p.name for p in parameters if LIST_ANNOTATION in str(p.annotation))
    return ToolSpec(name=name, description=description, arguments=arguments, required=required, lists=lists)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    head, _, args = doc.partition("\nArgs:\n")
    arguments: dict[str, str] = {}
    current: str | None = None
    for line in args.splitlines():
        match = _ARG_LINE.match(line.strip())
        if match and not line.startswith(" " * 5):  # a new argument, not a continuation line
            current = match.group(1)
            arguments[current] = match.group(2)
        elif current is not None and line.strip():
            arguments[current] += " " + line.strip()
    return head.strip(), arguments
