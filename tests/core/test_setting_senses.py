"""The speech-to-text settings a typo would break at the first voice note are refused at start: a base URL the
client cannot POST to (no host, another scheme, a query the path would be added after), a language that is no
code (the service would be sent it as is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import SettingsError, load_settings


@pytest.fixture(autouse=True)
def _no_dotenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("http://", "has no host"),
        ("ftp://stt.example/v1", "must start with http:// or https://"),
        ("127.0.0.1:8000/v1", "must start with http:// or https://"),
        ("https://stt.example/v1?key=1", "no ?query or #fragment"),
        ("https://stt.example/v1#x", "no ?query or #fragment"),
        ("https://[::1/v1", "is not a URL"),
    ],
)
def test_an_stt_base_url_the_client_cannot_post_to_is_refused(
    monkeypatch: pytest.MonkeyPatch, raw: str, reason: str
) -> None:
    monkeypatch.setenv("STT_BASE_URL", raw)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    [line] = raised.value.lines
    assert line.startswith("invalid setting STT_BASE_URL: ") and reason in line


def test_a_good_stt_base_url_loses_its_trailing_slash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STT_BASE_URL", "http://127.0.0.1:9000/v1/")
    assert load_settings().stt_base_url == "http://127.0.0.1:9000/v1"


@pytest.mark.parametrize("raw", ["en", "yue", "pt-BR", "es-419"])
def test_a_language_code_is_taken(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("STT_LANGUAGE", raw)
    assert load_settings().stt_language == raw


@pytest.mark.parametrize("raw", ["русский", "ü", "e", "english", "en_US", "en-", "-en"])
def test_what_is_no_language_code_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("STT_LANGUAGE", raw)
    with pytest.raises(SettingsError, match=r"^invalid setting STT_LANGUAGE: must be a language code"):
        load_settings()
