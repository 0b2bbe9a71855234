"""Settings: the design's defaults, list parsing, errors that name the variable, and the `.env` file."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import (
    DEFAULT_TELEGRAM_API_BASE_URL,
    CancelScope,
    LLMProvider,
    LogFormat,
    Settings,
    SettingsError,
    load_settings,
)
from tests.conftest import settings_env_names

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_dotenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every test from an empty directory, so no `.env` but the one a test writes is read."""
    monkeypatch.chdir(tmp_path)


def test_defaults_match_the_design_table() -> None:
    s = load_settings()

    assert s.telegram_bot_token is None
    assert s.telegram_api_base_url == DEFAULT_TELEGRAM_API_BASE_URL == "https://api.telegram.org/bot"
    assert s.allowed_chat_ids == []
    assert s.allow_all_chats is False
    assert s.admin_user_ids == []
    assert s.assistant_name == "Crew"
    assert s.llm_provider is LLMProvider.OFFLINE
    assert (s.llm_base_url, s.llm_api_key, s.llm_model) == (None, None, None)
    assert s.effective_subagent_model is None
    assert s.max_concurrent_subagents == 3
    assert s.max_subagents_per_chat == 3
    assert s.subagent_timeout_seconds == 900
    assert s.merge_window_seconds == 3
    assert s.merge_cancel_scope is CancelScope.TURN
    assert s.typing_interval_seconds == 4
    assert s.subagent_image == "crewbot-agent:latest"
    assert s.subagent_network == "none"
    assert (s.subagent_memory, s.subagent_cpus, s.subagent_pids) == ("512m", 1.0, 256)
    assert s.data_dir == Path("./data")
    assert s.log_format is LogFormat.CONSOLE
    assert s.log_level == "INFO"


def test_subagent_model_defaults_to_llm_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_PROVIDER", "openai")
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("LLM_MODEL", "main-model")

    assert load_settings().effective_subagent_model == "main-model"

    monkeypatch.setenv("SUBAGENT_MODEL", "small-model")
    assert load_settings().effective_subagent_model == "small-model"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1, -100", [1, -100]), ("-1001234567890", [-1001234567890]), ("", []), (" 5 ,,6 ", [5, 6])],
)
def test_id_lists_are_comma_separated(monkeypatch: pytest.MonkeyPatch, raw: str, expected: list[int]) -> None:
    monkeypatch.setenv("ALLOWED_CHAT_IDS", raw)
    monkeypatch.setenv("ADMIN_USER_IDS", raw)

    s = load_settings()

    assert s.allowed_chat_ids == expected
    assert s.admin_user_ids == expected


def test_chat_allowed_follows_the_list_and_the_escape_hatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOWED_CHAT_IDS", "1, -100")
    s = load_settings()
    assert s.chat_allowed(-100)
    assert not s.chat_allowed(2)

    monkeypatch.setenv("ALLOW_ALL_CHATS", "true")
    assert load_settings().chat_allowed(2)


def test_malformed_number_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_CONCURRENT_SUBAGENTS", "abc")

    with pytest.raises(SettingsError) as raised:
        load_settings()

    message = str(raised.value)
    assert "MAX_CONCURRENT_SUBAGENTS" in message
    assert "'abc'" in message
    assert len(message.splitlines()) == 1


def test_malformed_id_list_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOWED_CHAT_IDS", "1, x")

    with pytest.raises(SettingsError, match="ALLOWED_CHAT_IDS"):
        load_settings()


def test_every_bad_variable_gets_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_CONCURRENT_SUBAGENTS", "abc")
    monkeypatch.setenv("LOG_LEVEL", "chatty")

    with pytest.raises(SettingsError) as raised:
        load_settings()

    lines = str(raised.value).splitlines()
    assert len(lines) == 2
    assert any("MAX_CONCURRENT_SUBAGENTS" in line for line in lines)
    assert any("LOG_LEVEL" in line for line in lines)


def test_anthropic_without_model_names_llm_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_PROVIDER", "anthropic")
    monkeypatch.setenv("LLM_API_KEY", "sk-ant-123456")

    with pytest.raises(SettingsError, match="LLM_MODEL"):
        load_settings()


def test_anthropic_without_key_names_llm_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_PROVIDER", "anthropic")
    monkeypatch.setenv("LLM_MODEL", "claude-x")

    with pytest.raises(SettingsError) as raised:
        load_settings()

    assert "LLM_API_KEY" in str(raised.value)
    assert "LLM_MODEL" not in str(raised.value)


def test_anthropic_without_model_and_key_names_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_PROVIDER", "anthropic")

    with pytest.raises(SettingsError) as raised:
        load_settings()

    message = str(raised.value)
    assert "LLM_MODEL" in message
    assert "LLM_API_KEY" in message


def test_dotenv_file_is_read(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "ASSISTANT_NAME=Robo\nALLOWED_CHAT_IDS=7,-100123\nMERGE_WINDOW_SECONDS=1.5\nTELEGRAM_BOT_TOKEN=\n",
        encoding="utf-8",
    )

    s = load_settings()

    assert s.assistant_name == "Robo"
    assert s.allowed_chat_ids == [7, -100123]
    assert s.merge_window_seconds == 1.5
    assert s.telegram_bot_token is None  # blank means unset


def test_environment_overrides_dotenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("ASSISTANT_NAME=FromFile\nLOG_LEVEL=debug\n", encoding="utf-8")
    monkeypatch.setenv("ASSISTANT_NAME", "FromEnv")

    s = load_settings()

    assert s.assistant_name == "FromEnv"
    assert s.log_level == "DEBUG"


def test_secrets_are_not_shown_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123456:very-secret-token")

    s = load_settings()

    assert s.telegram_bot_token is not None
    assert s.telegram_bot_token.get_secret_value() == "123456:very-secret-token"
    assert "very-secret-token" not in repr(s)


def test_blank_llm_base_url_means_the_public_api(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("LLM_PROVIDER=openai\nLLM_MODEL=gpt-x\nLLM_BASE_URL=\n", encoding="utf-8")

    with pytest.raises(SettingsError, match="LLM_API_KEY"):
        load_settings()


def test_env_example_documents_every_setting() -> None:
    example = (REPO_ROOT / ".env.example").read_text(encoding="utf-8")
    documented = {line.split("=", 1)[0].strip() for line in example.splitlines() if "=" in line and line[:1] != "#"}

    assert settings_env_names() - documented == set()


def test_settings_ignore_unknown_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOMETHING_ELSE", "1")

    assert isinstance(load_settings(), Settings)


@pytest.mark.parametrize("raw", ["[-1001234567890, 42]", " [-1001234567890,42] ", "[]"])
def test_id_lists_may_be_json_as_pydantic_settings_users_write_them(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("ALLOWED_CHAT_IDS", raw)

    expected = [] if raw == "[]" else [-1001234567890, 42]
    assert load_settings().allowed_chat_ids == expected


@pytest.mark.parametrize(("raw", "shown"), [("abc", "'abc'"), ("1, x", "'x' is not one"), ("[1, x]", "not valid JSON")])
def test_a_bad_id_list_is_one_line_naming_the_variable_not_an_item(
    monkeypatch: pytest.MonkeyPatch, raw: str, shown: str
) -> None:
    monkeypatch.setenv("ALLOWED_CHAT_IDS", raw)

    with pytest.raises(SettingsError) as raised:
        load_settings()

    [line] = raised.value.lines
    assert line.startswith("invalid setting ALLOWED_CHAT_IDS: ")  # not ALLOWED_CHAT_IDS.0
    assert shown in line
    assert "-1001234567890,42" in line  # how to write it


@pytest.mark.parametrize("raw", ["512m", "2g", "64M", "1073741824", "7000k"])
def test_subagent_memory_in_dockers_format_is_accepted(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("SUBAGENT_MEMORY", raw)

    assert load_settings().subagent_memory == raw


@pytest.mark.parametrize(("raw", "reason"), [("lots", "digits"), ("5mb", "digits"), ("-1m", "digits"), ("1k", "6m")])
def test_subagent_memory_is_checked_at_start_up(monkeypatch: pytest.MonkeyPatch, raw: str, reason: str) -> None:
    monkeypatch.setenv("SUBAGENT_MEMORY", raw)

    with pytest.raises(SettingsError) as raised:
        load_settings()

    [line] = raised.value.lines
    assert line.startswith("invalid setting SUBAGENT_MEMORY: ") and reason in line and repr(raw) in line


@pytest.mark.parametrize("name", ["TELEGRAM_API_BASE_URL", "LLM_BASE_URL"])
def test_urls_need_a_scheme(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "127.0.0.1:8000/v1")

    with pytest.raises(SettingsError, match=f"^invalid setting {name}: must start with http:// or https://"):
        load_settings()


def test_a_malformed_token_is_named_but_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "not-a-token-SECRETVALUE")

    with pytest.raises(SettingsError) as raised:
        load_settings()

    assert "TELEGRAM_BOT_TOKEN" in str(raised.value)
    assert "SECRETVALUE" not in str(raised.value)


def test_a_pasted_token_loses_surrounding_spaces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", " 123456:abc_DEF-42 ")

    token = load_settings().telegram_bot_token
    assert token is not None and token.get_secret_value() == "123456:abc_DEF-42"


def test_schedule_settings_default_and_an_unknown_time_zone_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert settings.timezone == "UTC"
    assert settings.schedule_min_interval_seconds == 300
    assert settings.max_tasks_per_chat == 20
    assert settings.schedule_max_failures == 5
    monkeypatch.setenv("TIMEZONE", "Mars/Olympus")

    with pytest.raises(SettingsError) as raised:
        load_settings()

    assert str(raised.value).startswith("invalid setting TIMEZONE: unknown time zone 'Mars/Olympus'")
