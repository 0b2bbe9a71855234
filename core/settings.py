"""Operator settings from the environment and `.env` (docs/settings.md is their reference)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from core.egress_rules import EgressMode
from core.setting_bounds import (
    BYTES_PER_MIB,
    MAX_DAILY_TOKENS,
    MAX_DATA_RETENTION_DAYS,
    MAX_INT64,
    MAX_IPC_MAX_FILE_BYTES,
    MAX_IPC_RESCAN_SECONDS,
    MAX_LLM_TIMEOUT_SECONDS,
    MAX_MERGE_WINDOW_SECONDS,
    MAX_PRICE_PER_MTOK,
    MAX_SCHEDULE_MIN_INTERVAL_SECONDS,
    MAX_SCHEDULE_MISFIRE_GRACE_SECONDS,
    MAX_SUBAGENT_EGRESS_CONNECTIONS,
    MAX_SUBAGENT_EGRESS_MB,
    MAX_SUBAGENT_FILE_MB,
    MAX_SUBAGENT_FILES,
    MAX_SUBAGENT_MAX_TOKENS,
    MAX_SUBAGENT_PIDS,
    MAX_SUBAGENT_RUN_FILES_MB,
    MAX_SUBAGENT_TIMEOUT_SECONDS,
    MAX_TYPING_INTERVAL_SECONDS,
    MAX_WORKSPACE_QUOTA_MB,
    MIN_DATA_RETENTION_DAYS,
    MIN_IPC_MAX_FILE_BYTES,
    MIN_IPC_RESCAN_SECONDS,
    MIN_LLM_TIMEOUT_SECONDS,
    MIN_SUBAGENT_CPUS,
    MIN_SUBAGENT_MAX_TOKENS,
    MIN_SUBAGENT_PIDS,
    MIN_SUBAGENT_TIMEOUT_SECONDS,
    MIN_TYPING_INTERVAL_SECONDS,
    AtMostHost,
    allowed_range,
    host_cpu_count,
    host_memory_bytes,
)
from core.setting_lists import allow_entries, apt_packages, pip_requirements, split_ids
from core.setting_turns import TurnSettings
from core.setting_webhook import DEFAULT_WEBHOOK_LISTEN, WebhookListen, WebhookSecret, WebhookUrl

MAX_TCP_PORT = 65535
MAX_SUBAGENTS_CEILING = 100  # the highest cap a setting accepts (the Docker runtime's pool is sized for it)
MAX_WARM_POOL = 20  # containers kept ready: each holds an idle agent's memory (the Docker runtime's threads too)
DEFAULT_WARM_POOL = 2  # suits a 2-core host: two runs start at once without a container start, ~14 MiB each idle
DEFAULT_TELEGRAM_API_BASE_URL = "https://api.telegram.org/bot"
# Docker's format for memory limits (the SDK's parse_bytes): digits with an optional unit.
MEMORY_LIMIT = re.compile(r"^(\d{1,20})([bkmg]?)$", re.IGNORECASE)  # more digits: past int64 anyway
MEMORY_UNIT_BYTES = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
MIN_MEMORY_BYTES = 6 * 1024**2  # the engine refuses a limit below 6 MB
BOT_TOKEN_SHAPE = re.compile(r"^\d+:[A-Za-z0-9_-]+$")  # <bot id>:<secret>, as @BotFather gives it
SECRET_SETTINGS = frozenset(
    {"TELEGRAM_BOT_TOKEN", "LLM_API_KEY", "TELEGRAM_WEBHOOK_SECRET", "STT_API_KEY"}
)  # never echoed
DEFAULT_REJECT_MESSAGE = (
    "All subagent slots are busy ({running} running, limit {limit}): {not_started} not started. Please try again later."
)


class LLMProvider(StrEnum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    OFFLINE = "offline"


class CancelScope(StrEnum):
    TURN = "turn"
    CHAT = "chat"


class ResultMode(StrEnum):
    """How a finished subagent's result reaches the chat."""

    DIRECT = "direct"  # sent as its own [Subagent] message
    ANNOUNCE = "announce"  # handed to the main agent as a new turn; it writes the chat's message, or stays silent


class LogFormat(StrEnum):
    CONSOLE = "console"
    JSON = "json"


def check_timezone(name: str) -> str:
    """An IANA time zone name the system knows (e.g. Europe/Berlin); ValueError naming the problem."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name[:60]!r}: use an IANA name such as UTC or Europe/Berlin") from None
    return name


def memory_limit_bytes(value: str, max_bytes: int = MAX_INT64) -> int:
    """Bytes of a Docker memory limit such as `512m`; ValueError naming the allowed range when it is not one
    from 6m (the engine's minimum) to `max_bytes` (int64, the engine's field, unless a host is smaller)."""
    match = MEMORY_LIMIT.match(value.strip())
    size = int(match.group(1)) * MEMORY_UNIT_BYTES[match.group(2).lower()] if match else 0
    if not MIN_MEMORY_BYTES <= size <= max_bytes:
        most = f"{max_bytes // BYTES_PER_MIB}m" + (" (this host's memory)" if max_bytes < MAX_INT64 else "")
        raise ValueError(f"must be digits with an optional unit b, k, m or g, from 6m to {most}")
    return size


class Settings(TurnSettings):
    """Every setting crewbot reads; docs/settings.md is generated from them (crewbot/settings_reference.py)."""

    model_config = SettingsConfigDict(env_file=".env", env_file_encoding="utf-8", extra="ignore", case_sensitive=False)

    telegram_bot_token: SecretStr | None = Field(default=None, alias="TELEGRAM_BOT_TOKEN")
    telegram_api_base_url: str = Field(default=DEFAULT_TELEGRAM_API_BASE_URL, alias="TELEGRAM_API_BASE_URL")
    # Webhook mode (docs/telegram.md): Telegram POSTs updates to this public HTTPS URL; empty: long polling.
    telegram_webhook_url: WebhookUrl = Field(default=None, alias="TELEGRAM_WEBHOOK_URL")
    telegram_webhook_listen: WebhookListen = Field(default=DEFAULT_WEBHOOK_LISTEN, alias="TELEGRAM_WEBHOOK_LISTEN")
    telegram_webhook_secret: WebhookSecret = Field(None, alias="TELEGRAM_WEBHOOK_SECRET", validate_default=True)
    allowed_chat_ids: Annotated[list[int], NoDecode] = Field(default_factory=list, alias="ALLOWED_CHAT_IDS")
    allow_all_chats: bool = Field(default=False, alias="ALLOW_ALL_CHATS")
    admin_user_ids: Annotated[list[int], NoDecode] = Field(default_factory=list, alias="ADMIN_USER_IDS")
    assistant_name: str = Field(default="Crew", min_length=1, max_length=64, alias="ASSISTANT_NAME")

    llm_provider: LLMProvider = Field(default=LLMProvider.OFFLINE, alias="LLM_PROVIDER")
    llm_base_url: str | None = Field(default=None, alias="LLM_BASE_URL")
    llm_api_key: SecretStr | None = Field(default=None, alias="LLM_API_KEY")
    llm_model: str | None = Field(default=None, alias="LLM_MODEL")
    llm_timeout_seconds: float = Field(
        default=120.0,
        ge=MIN_LLM_TIMEOUT_SECONDS,
        le=MAX_LLM_TIMEOUT_SECONDS,
        allow_inf_nan=False,
        alias="LLM_TIMEOUT_SECONDS",
    )
    subagent_model: str | None = Field(default=None, alias="SUBAGENT_MODEL")

    max_concurrent_subagents: int = Field(default=3, ge=1, le=MAX_SUBAGENTS_CEILING, alias="MAX_CONCURRENT_SUBAGENTS")
    max_subagents_per_chat: int = Field(default=3, ge=1, le=MAX_SUBAGENTS_CEILING, alias="MAX_SUBAGENTS_PER_CHAT")
    subagent_timeout_seconds: float = Field(
        default=900.0,
        ge=MIN_SUBAGENT_TIMEOUT_SECONDS,
        le=MAX_SUBAGENT_TIMEOUT_SECONDS,
        allow_inf_nan=False,
        alias="SUBAGENT_TIMEOUT_SECONDS",
    )
    subagent_reject_message: str = Field(default=DEFAULT_REJECT_MESSAGE, alias="SUBAGENT_REJECT_MESSAGE")
    subagent_result_mode: ResultMode = Field(default=ResultMode.DIRECT, alias="SUBAGENT_RESULT_MODE")
    # One message per turn that spawned subagents, edited as their states change.
    status_card: bool = Field(default=True, alias="STATUS_CARD")
    # Requests over a cap wait here for a slot (0: refused at once, as before the queue existed).
    subagent_queue_limit: int = Field(default=20, ge=0, le=1000, alias="SUBAGENT_QUEUE_LIMIT")
    merge_window_seconds: float = Field(
        default=3.0, ge=0, le=MAX_MERGE_WINDOW_SECONDS, allow_inf_nan=False, alias="MERGE_WINDOW_SECONDS"
    )
    merge_cancel_scope: CancelScope = Field(default=CancelScope.TURN, alias="MERGE_CANCEL_SCOPE")
    typing_interval_seconds: float = Field(
        default=4.0,
        ge=MIN_TYPING_INTERVAL_SECONDS,
        le=MAX_TYPING_INTERVAL_SECONDS,
        allow_inf_nan=False,
        alias="TYPING_INTERVAL_SECONDS",
    )
    history_window_messages: int = Field(default=50, ge=1, le=1000, alias="HISTORY_WINDOW_MESSAGES")

    subagent_image: str = Field(default="crewbot-agent:latest", alias="SUBAGENT_IMAGE")
    subagent_network: str = Field(default="none", alias="SUBAGENT_NETWORK")
    subagent_memory: str = Field(default="512m", alias="SUBAGENT_MEMORY")
    subagent_cpus: Annotated[float, AtMostHost(host_cpu_count, "this host's CPU cores")] = Field(
        default=1.0, ge=MIN_SUBAGENT_CPUS, allow_inf_nan=False, alias="SUBAGENT_CPUS"
    )
    subagent_pids: int = Field(default=256, ge=MIN_SUBAGENT_PIDS, le=MAX_SUBAGENT_PIDS, alias="SUBAGENT_PIDS")
    subagent_warm_pool: int = Field(default=DEFAULT_WARM_POOL, ge=0, le=MAX_WARM_POOL, alias="SUBAGENT_WARM_POOL")

    # Budgets: what one run may cause, enforced on the host (docs/security.md "How the boundary is held").
    subagent_max_tokens: int = Field(
        default=200_000, ge=MIN_SUBAGENT_MAX_TOKENS, le=MAX_SUBAGENT_MAX_TOKENS, alias="SUBAGENT_MAX_TOKENS"
    )
    subagent_max_messages: int = Field(default=10, ge=0, le=1_000, alias="SUBAGENT_MAX_MESSAGES")
    subagent_session_max_messages: int = Field(default=200, ge=0, le=10_000, alias="SUBAGENT_SESSION_MAX_MESSAGES")
    # Files: Telegram hands bots files up to 20 MB and takes uploads up to 50 MB (a local Bot API server more).
    subagent_max_file_mb: int = Field(default=20, ge=1, le=MAX_SUBAGENT_FILE_MB, alias="SUBAGENT_MAX_FILE_MB")
    subagent_max_files: int = Field(default=5, ge=0, le=MAX_SUBAGENT_FILES, alias="SUBAGENT_MAX_FILES")
    subagent_run_files_mb: int = Field(default=100, ge=1, le=MAX_SUBAGENT_RUN_FILES_MB, alias="SUBAGENT_RUN_FILES_MB")
    subagent_allow_provider_tools: bool = Field(default=False, alias="SUBAGENT_ALLOW_PROVIDER_TOOLS")
    # What a day may cost (0: no allowance); changeable live. Prices only turn tokens into money in reports.
    chat_daily_tokens: int = Field(default=0, ge=0, le=MAX_DAILY_TOKENS, alias="CHAT_DAILY_TOKENS")
    daily_tokens: int = Field(default=0, ge=0, le=MAX_DAILY_TOKENS, alias="DAILY_TOKENS")
    llm_price_input_per_mtok: float = Field(
        default=0.0, ge=0, le=MAX_PRICE_PER_MTOK, allow_inf_nan=False, alias="LLM_PRICE_INPUT_PER_MTOK"
    )
    llm_price_output_per_mtok: float = Field(
        default=0.0, ge=0, le=MAX_PRICE_PER_MTOK, allow_inf_nan=False, alias="LLM_PRICE_OUTPUT_PER_MTOK"
    )
    subagent_price_input_per_mtok: float | None = Field(
        default=None, ge=0, le=MAX_PRICE_PER_MTOK, allow_inf_nan=False, alias="SUBAGENT_PRICE_INPUT_PER_MTOK"
    )
    subagent_price_output_per_mtok: float | None = Field(
        default=None, ge=0, le=MAX_PRICE_PER_MTOK, allow_inf_nan=False, alias="SUBAGENT_PRICE_OUTPUT_PER_MTOK"
    )
    # The web, through the door the operator controls (docs/files-and-web.md); live, for the next run.
    subagent_egress: EgressMode = Field(default=EgressMode.NONE, alias="SUBAGENT_EGRESS")
    subagent_egress_allow: Annotated[list[str], NoDecode] = Field(default_factory=list, alias="SUBAGENT_EGRESS_ALLOW")
    subagent_egress_max_mb: int = Field(default=50, ge=1, le=MAX_SUBAGENT_EGRESS_MB, alias="SUBAGENT_EGRESS_MAX_MB")
    subagent_egress_max_connections: int = Field(
        default=16, ge=1, le=MAX_SUBAGENT_EGRESS_CONNECTIONS, alias="SUBAGENT_EGRESS_MAX_CONNECTIONS"
    )
    # Tools baked into the subagent image by `crewbot image build`, fetched on the host.
    subagent_image_packages: Annotated[list[str], NoDecode] = Field(
        default_factory=list, alias="SUBAGENT_IMAGE_PACKAGES"
    )
    subagent_image_apt: Annotated[list[str], NoDecode] = Field(default_factory=list, alias="SUBAGENT_IMAGE_APT")
    workspace_quota_mb: int = Field(default=1024, ge=1, le=MAX_WORKSPACE_QUOTA_MB, alias="WORKSPACE_QUOTA_MB")
    data_retention_days: float = Field(
        default=30.0,
        ge=MIN_DATA_RETENTION_DAYS,
        le=MAX_DATA_RETENTION_DAYS,
        allow_inf_nan=False,
        alias="DATA_RETENTION_DAYS",
    )

    ipc_force_polling: bool = Field(default=False, alias="IPC_FORCE_POLLING")
    ipc_rescan_seconds: float = Field(
        default=5.0,
        ge=MIN_IPC_RESCAN_SECONDS,
        le=MAX_IPC_RESCAN_SECONDS,
        allow_inf_nan=False,
        alias="IPC_RESCAN_SECONDS",
    )
    ipc_max_file_bytes: int = Field(
        default=256 * 1024, ge=MIN_IPC_MAX_FILE_BYTES, le=MAX_IPC_MAX_FILE_BYTES, alias="IPC_MAX_FILE_BYTES"
    )

    # Scheduled tasks (docs/using.md "Scheduled tasks").
    timezone: str = Field(default="UTC", alias="TIMEZONE")
    schedule_min_interval_seconds: int = Field(
        default=300, ge=1, le=MAX_SCHEDULE_MIN_INTERVAL_SECONDS, alias="SCHEDULE_MIN_INTERVAL_SECONDS"
    )
    schedule_misfire_grace_seconds: int = Field(
        default=300, ge=1, le=MAX_SCHEDULE_MISFIRE_GRACE_SECONDS, alias="SCHEDULE_MISFIRE_GRACE_SECONDS"
    )
    schedule_max_failures: int = Field(default=5, ge=1, le=100, alias="SCHEDULE_MAX_FAILURES")
    max_tasks_per_chat: int = Field(default=20, ge=1, le=1000, alias="MAX_TASKS_PER_CHAT")

    # Prometheus /metrics with /healthz and /readyz, e.g. 127.0.0.1:9464; empty: off.
    metrics_addr: str | None = Field(default=None, alias="METRICS_ADDR")

    data_dir: Path = Field(default=Path("./data"), alias="DATA_DIR")
    log_format: LogFormat = Field(default=LogFormat.CONSOLE, alias="LOG_FORMAT")
    log_level: str = Field(default="INFO", alias="LOG_LEVEL")

    @field_validator("allowed_chat_ids", "admin_user_ids", mode="before")
    @classmethod
    def _parse_id_list(cls, value: object) -> object:
        return split_ids(value)

    @field_validator("subagent_egress_allow", mode="before")
    @classmethod
    def _parse_allow(cls, value: object) -> object:
        return allow_entries(value)

    @field_validator("subagent_image_packages", mode="before")
    @classmethod
    def _parse_packages(cls, value: object) -> object:
        return pip_requirements(value)

    @field_validator("subagent_image_apt", mode="before")
    @classmethod
    def _parse_apt(cls, value: object) -> object:
        return apt_packages(value)

    @field_validator("subagent_memory")
    @classmethod
    def _check_memory(cls, value: str) -> str:
        memory_limit_bytes(value, min(host_memory_bytes(), MAX_INT64))
        return value.strip()

    @field_validator("metrics_addr", mode="before")
    @classmethod
    def _check_metrics_addr(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        text = str(value).strip()
        _host, colon, port = text.rpartition(":")
        if not colon or not port.isdigit() or int(port) > MAX_TCP_PORT:
            raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:9464 (empty: no metrics endpoint)")
        return text

    @field_validator("telegram_api_base_url", "llm_base_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @field_validator("telegram_bot_token")
    @classmethod
    def _check_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not BOT_TOKEN_SHAPE.match(value.get_secret_value()):
            raise ValueError(
                "does not look like a bot token (digits, a colon, then letters and digits), as @BotFather gives it"
            )
        return value

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, value: str) -> str:
        return check_timezone(value.strip())

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @field_validator("telegram_bot_token", "llm_api_key", "llm_base_url", "llm_model", "subagent_model", mode="before")
    @classmethod
    def _blank_is_none(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip() or None  # a stray space after a pasted token is not part of it
        return value

    @model_validator(mode="after")
    def _check_provider(self) -> Settings:
        if self.llm_provider is LLMProvider.OFFLINE:
            return self
        problems = []
        if not self.llm_model:
            problems.append(f"LLM_MODEL: required when LLM_PROVIDER={self.llm_provider.value}")
        needs_key = self.llm_provider is LLMProvider.ANTHROPIC or self.llm_base_url is None
        if needs_key and self.llm_api_key is None:
            problems.append(f"LLM_API_KEY: required when LLM_PROVIDER={self.llm_provider.value}")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def effective_subagent_model(self) -> str | None:
        return self.subagent_model or self.llm_model

    @property
    def db_path(self) -> Path:
        return self.data_dir / "crewbot.sqlite3"

    def chat_allowed(self, chat_id: int) -> bool:
        return self.allow_all_chats or chat_id in self.allowed_chat_ids


class SettingsError(Exception):
    """Start-up cannot go on: the message is one line per bad variable, each naming it."""

    @property
    def lines(self) -> list[str]:
        return str(self).splitlines()


def _error_line(loc: tuple[int | str, ...], message: str, got: object) -> str:
    name = str(loc[0]).upper()
    info = next((info for info in Settings.model_fields.values() if info.alias == name), None)
    bounds = allowed_range(info) if info is not None else None
    if bounds is not None:  # whichever bound (or the number's form) failed, the line names the whole range
        message = f"must be {bounds}"
    shown = ""
    if name not in SECRET_SETTINGS and got is not None and not isinstance(got, dict | list):
        shown = f" (got {str(got)[:60]!r})"
    return f"invalid setting {name}: {message}{shown}"


def load_settings(**overrides: object) -> Settings:
    """Read settings, turning pydantic's report into lines that name the environment variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        lines: list[str] = []
        for error in exc.errors():
            message = error["msg"].removeprefix("Value error, ")
            if not error["loc"]:
                lines.extend(f"invalid setting {line}" for line in message.splitlines())
            else:
                lines.append(_error_line(error["loc"], message, error.get("input")))
        raise SettingsError("\n".join(dict.fromkeys(lines))) from None
    except (OSError, UnicodeDecodeError) as exc:  # an unreadable `.env`
        raise SettingsError(f"cannot read the .env file: {exc}") from None


def without_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` minus every crewbot setting: for a bot process started with settings of the caller's own
    (the tests' and benchmarks' real processes), whatever the operator's shell has set."""
    names = {field.alias.upper() for field in Settings.model_fields.values() if field.alias}
    return {key: value for key, value in environ.items() if key.upper() not in names}
