"""The settings that are lists: the egress allowlist and the packages baked into the image, as an operator
writes them (`.env` words or a JSON list), each checked with a line that says what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import SettingsError, load_settings


def test_allowlist_entries_are_kept_in_their_standard_form(tmp_path: Path) -> None:
    settings = load_settings(
        DATA_DIR=str(tmp_path), SUBAGENT_EGRESS_ALLOW=" PyPI.org, *.Wikipedia.org ,api.github.com:443,[::1]:8080"
    )
    assert settings.subagent_egress_allow == ["pypi.org", "*.wikipedia.org", "api.github.com:443", "[::1]:8080"]
    as_json = load_settings(DATA_DIR=str(tmp_path), SUBAGENT_EGRESS_ALLOW='["pypi.org", "127.0.0.1:9"]')
    assert as_json.subagent_egress_allow == ["pypi.org", "127.0.0.1:9"]


@pytest.mark.parametrize(
    "entry", ["*", "*.*.org", "http://pypi.org", "pypi.org/simple", "x:0", "x:99999", "a b", "2130706433"]
)
def test_an_allowlist_entry_that_is_no_host_is_refused(tmp_path: Path, entry: str) -> None:
    with pytest.raises(SettingsError, match="SUBAGENT_EGRESS_ALLOW"):
        load_settings(DATA_DIR=str(tmp_path), SUBAGENT_EGRESS_ALLOW=entry)


def test_packages_are_requirements_separated_by_blanks(tmp_path: Path) -> None:
    settings = load_settings(
        DATA_DIR=str(tmp_path),
        SUBAGENT_IMAGE_PACKAGES="pandas  matplotlib>=3,<4 pypdf[full]",
        SUBAGENT_IMAGE_APT="poppler-utils, git",
    )
    assert settings.subagent_image_packages == ["pandas", "matplotlib>=3,<4", "pypdf[full]"]
    assert settings.subagent_image_apt == ["poppler-utils", "git"]


@pytest.mark.parametrize(
    "spec",
    [
        "https://evil.example/x.whl",  # a URL
        "pandas@https://evil.example/x.whl",
        "git+https://evil.example/repo",
        "./local/path",
        "-e",  # an option
        "--index-url=https://evil.example",
        "pandas;rm",  # shell metacharacters
        "pandas|id",
        "a$(id)",
        "`id`",
        "pandas>=1;python_version<'4'",  # markers: not needed, and a way to smuggle text
    ],
)
def test_a_package_spec_with_a_url_an_option_or_a_shell_character_is_refused(tmp_path: Path, spec: str) -> None:
    with pytest.raises(SettingsError, match=r"SUBAGENT_IMAGE_PACKAGES.*not a package requirement"):
        load_settings(DATA_DIR=str(tmp_path), SUBAGENT_IMAGE_PACKAGES=spec)


@pytest.mark.parametrize("name", ["Poppler", "-x", "git;id", "a/b", "x" * 120])
def test_a_debian_name_that_is_not_one_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(SettingsError, match="SUBAGENT_IMAGE_APT"):
        load_settings(DATA_DIR=str(tmp_path), SUBAGENT_IMAGE_APT=name)
