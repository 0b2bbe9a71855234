"""Settings an operator changes on the running bot: validated as at start-up, persisted, logged with who.

A change is validated by building the whole `Settings` again from the values in force plus the new one,
so it meets the same validators and fails with the same line as a bad value at start-up. Only then is the
one field set on the shared `Settings` object that every component reads at decision time: the caps at
the next spawn, the container limits and time-out at the next container start. Running containers keep
what they started with.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path

from dotenv import dotenv_values
from pydantic import SecretStr

from core.logging import get_logger
from core.settings import Settings, SettingsError, load_settings
from core.store.setting_overrides import SettingChange, SettingOverrideStore, now_change

log = get_logger(__name__)

# What may change without a restart: each is read where it is used, at the moment it is used.
LIVE_SETTINGS = (
    "MAX_CONCURRENT_SUBAGENTS",
    "MAX_SUBAGENTS_PER_CHAT",
    "SUBAGENT_QUEUE_LIMIT",
    "SUBAGENT_MEMORY",
    "SUBAGENT_CPUS",
    "SUBAGENT_TIMEOUT_SECONDS",
    "CHAT_DAILY_TOKENS",
    "DAILY_TOKENS",
    "LLM_PRICE_INPUT_PER_MTOK",
    "LLM_PRICE_OUTPUT_PER_MTOK",
    "SUBAGENT_PRICE_INPUT_PER_MTOK",
    "SUBAGENT_PRICE_OUTPUT_PER_MTOK",
    "SUBAGENT_EGRESS",
    "SUBAGENT_EGRESS_ALLOW",
    "SUBAGENT_EGRESS_MAX_MB",
    "SUBAGENT_EGRESS_MAX_CONNECTIONS",
    "SUBAGENT_ASK_TIMEOUT_SECONDS",
    "SUBAGENT_MAX_QUESTIONS",
    "SUBAGENT_APPROVAL",
)


class SettingSource(StrEnum):
    DEFAULT = "default"
    ENV = "env"
    DOTENV = ".env"
    LIVE = "live override"


@dataclass(frozen=True, slots=True)
class EffectiveSetting:
    name: str
    value: str
    source: SettingSource
    live: bool  # changeable on the running bot


def field_names() -> dict[str, str]:
    """Environment name -> `Settings` field name."""
    return {str(info.alias): name for name, info in Settings.model_fields.items() if info.alias}


def display(value: object) -> str:
    """A value as an operator writes it (secrets never shown)."""
    if isinstance(value, SecretStr):
        return "[set]"
    if value is None:
        return ""
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(display(item) for item in value)
    return str(value)


def _values(settings: Settings) -> dict[str, object]:
    return {alias: getattr(settings, name) for alias, name in field_names().items()}


def validated(current: Settings, changes: Mapping[str, str]) -> Settings:
    """`current` with `changes` (environment names), through the start-up validation; SettingsError if not."""
    unknown = [name for name in changes if name not in LIVE_SETTINGS]
    if unknown:
        names = ", ".join(LIVE_SETTINGS)
        raise SettingsError(
            "\n".join(
                f"{name} cannot be changed on the running bot (set it in .env and restart); live: {names}"
                for name in unknown
            )
        )
    return load_settings(**{**_values(current), **changes})


class LiveConfig:
    def __init__(self, settings: Settings, store: SettingOverrideStore) -> None:
        self._settings = settings
        self._store = store
        self._overrides: dict[str, str] = {}
        self._lock = asyncio.Lock()  # one change at a time: each validates against the one before
        self._listeners: list[Callable[[str], None]] = []

    def watch(self, on_change: Callable[[str], None]) -> None:
        """Called with a setting's name after each change (a raised cap may start runs that wait)."""
        self._listeners.append(on_change)

    @property
    def settings(self) -> Settings:
        return self._settings

    async def load(self) -> list[str]:
        """At start-up: the overrides stored by earlier changes win over the environment.

        One that no longer validates (stored by an older version, or on a bigger host) is refused: not
        applied, its line logged and returned, the start-up value kept. Stopping start-up instead would leave
        no way to replace it, since `crewbot config set` needs the running bot.
        """
        stored = {name: value for name, value in (await self._store.all()).items() if name in LIVE_SETTINGS}
        refused: list[str] = []
        for name, value in sorted(stored.items()):
            try:
                fresh = await asyncio.to_thread(validated, self._settings, {name: value})
            except SettingsError as exc:
                kept = display(getattr(self._settings, field_names()[name]))
                note = f"; the live override stored by `crewbot config set` is not applied: {name} stays {kept}"
                refused.extend(line + note for line in exc.lines)
                continue
            self._apply(fresh, {name: value})
        for line in refused:
            log.warning("live_override_refused", line=line)
        if self._overrides:
            log.info("live_overrides_applied", settings=self._overrides)
        return refused

    async def set(self, name: str, value: str, changed_by: str) -> SettingChange:
        """Validate, persist and apply one change; SettingsError (the start-up line) when refused."""
        name = name.strip().upper()
        async with self._lock:
            fresh = await asyncio.to_thread(validated, self._settings, {name: value.strip()})
            field = field_names()[name]
            change = now_change(
                name, display(getattr(self._settings, field)), display(getattr(fresh, field)), changed_by
            )
            await self._store.set(change)
            self._apply(fresh, {name: change.new_value})
        log.info("setting_changed", setting=name, old=change.old_value, new=change.new_value, changed_by=changed_by)
        for on_change in self._listeners:
            try:
                on_change(name)
            except Exception:
                log.exception("setting_change_listener_failed", setting=name)
        return change

    def _apply(self, fresh: Settings, names: Mapping[str, str]) -> None:
        fields = field_names()
        for name, value in names.items():
            setattr(self._settings, fields[name], getattr(fresh, fields[name]))
            self._overrides[name] = value

    async def effective(self) -> list[EffectiveSetting]:
        """Every setting's value in force and where it came from."""
        env_file = self._settings.model_config.get("env_file")
        return await asyncio.to_thread(self._effective, Path(str(env_file)) if env_file else None)

    def _effective(self, env_file: Path | None) -> list[EffectiveSetting]:
        environ = {key.upper() for key in os.environ}
        dotenv = {key.upper() for key in dotenv_values(env_file)} if env_file and env_file.is_file() else set()
        rows = []
        for name, field in sorted(field_names().items()):
            source = (
                SettingSource.LIVE
                if name in self._overrides
                else SettingSource.ENV
                if name in environ
                else SettingSource.DOTENV
                if name in dotenv
                else SettingSource.DEFAULT
            )
            rows.append(EffectiveSetting(name, display(getattr(self._settings, field)), source, name in LIVE_SETTINGS))
        return rows


def parse_assignments(words: Iterable[str]) -> dict[str, str]:
    """`NAME=VALUE` words; ValueError naming the one that is not."""
    found: dict[str, str] = {}
    for word in words:
        name, eq, value = word.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"{word!r} is not NAME=VALUE (e.g. MAX_CONCURRENT_SUBAGENTS=5)")
        found[name.strip().upper()] = value
    return found
