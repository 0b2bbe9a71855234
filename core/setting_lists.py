"""Settings that are lists, as an env file writes them (`a,b` or words) or as a JSON list, each item checked:
chat and user ids, the egress allowlist, and the packages baked into the subagent image."""

from __future__ import annotations

import json
import re

from core.egress_rules import EntryInvalid, parse_entry

ID_LIST_HINT = "write e.g. -1001234567890,42 or [-1001234567890, 42]"


# A pip requirement by name, with extras and version bounds: no URL, path, option or shell metacharacter.
PIP_SPEC = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?(\[[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*\])?"
    r"((==|!=|<=|>=|~=|<|>)[A-Za-z0-9.*+!_-]{1,40}(,(==|!=|<=|>=|~=|<|>)[A-Za-z0-9.*+!_-]{1,40})*)?"
)
APT_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{1,99}")  # Debian policy's package names


def split_words(value: object, *, separators: str) -> list[str]:
    """A list as an env file writes it (separated by any of `separators`) or as a JSON list."""
    if isinstance(value, list):
        return [str(item).strip() for item in value if str(item).strip()]
    text = str(value or "").strip()
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError("starts with [ but is not a valid JSON list") from None
        if not isinstance(parsed, list):
            raise ValueError("starts with [ but is not a JSON list")
        return [str(item).strip() for item in parsed if str(item).strip()]
    return [word for word in re.split(f"[{re.escape(separators)}]+", text) if word]


def split_ids(value: object) -> object:
    """Accept `1,2,-100` (the natural way to write a list in an env file), a JSON list `[1, 2]` (as
    pydantic-settings users write lists) and a real list; refuse anything else with one clear reason."""
    if isinstance(value, int):
        return [value]
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"starts with [ but is not valid JSON: {ID_LIST_HINT}") from None
        items = parsed if isinstance(parsed, list) else [parsed]
    else:
        items = [part.strip() for part in text.split(",") if part.strip()]
    ids: list[int] = []
    for item in items:
        word = str(item).strip()
        if isinstance(item, bool) or not isinstance(item, int | str) or not re.fullmatch(r"-?\d+", word):
            which = "" if word == text else f" ({word[:30]!r} is not one)"
            raise ValueError(f"must be whole numbers{which}: {ID_LIST_HINT}")
        ids.append(int(word))
    return ids


def allow_entries(value: object) -> list[str]:
    """SUBAGENT_EGRESS_ALLOW, comma-separated: each entry in its standard form."""
    entries = split_words(value, separators=",")
    try:
        return [str(parse_entry(entry)) for entry in entries]
    except EntryInvalid as exc:
        raise ValueError(f"{exc}; write entries like pypi.org, *.wikipedia.org, api.github.com:443") from None


def pip_requirements(value: object) -> list[str]:
    """SUBAGENT_IMAGE_PACKAGES, separated by blanks (a comma belongs to a version range)."""
    specs = split_words(value, separators=" \t\n")
    for spec in specs:
        if not PIP_SPEC.fullmatch(spec):
            raise ValueError(
                f"{spec[:80]!r} is not a package requirement like pandas or numpy>=2 (no URLs, paths or options)"
            )
    return specs


def apt_packages(value: object) -> list[str]:
    """SUBAGENT_IMAGE_APT, separated by blanks or commas."""
    names = split_words(value, separators=" \t\n,")
    for name in names:
        if not APT_NAME.fullmatch(name):
            raise ValueError(f"{name[:80]!r} is not a Debian package name like poppler-utils")
    return names
