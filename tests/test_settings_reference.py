"""docs/settings.md is what crewbot/settings_reference.py makes of the Settings model: every setting has a text,
every text a setting, and the page in the repository is the generated one (else: regenerate it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.setting_texts import SETTING_GROUPS
from crewbot import settings_reference
from crewbot.settings_reference import REGENERATE, fields_by_alias, render


def test_every_setting_has_a_text_and_every_text_a_setting() -> None:
    names = [name for _group, texts in SETTING_GROUPS for name in texts]
    assert len(names) == len(set(names)), "a setting listed in two groups"
    assert sorted(names) == sorted(fields_by_alias())


def test_the_reference_page_is_the_generated_one() -> None:
    page = settings_reference.PAGE.read_text(encoding="utf-8")
    assert page == render(), f"docs/settings.md differs from the Settings model: run `{REGENERATE}`"


def test_the_reference_shows_each_settings_facts() -> None:
    page = render()
    cpus = page.split("### `SUBAGENT_CPUS`", 1)[1].split("###", 1)[0]
    # A bound the machine sets is named, not measured: the page reads the same on every machine.
    assert "**Default** `1` · **Values** a number from 0.01 to this host's CPU cores · *changeable live*" in cpus
    token = page.split("### `TELEGRAM_BOT_TOKEN`", 1)[1].split("###", 1)[0]
    assert "**Default** none · **Values** a secret · never shown or logged" in token
    assert "one of `docker`, `kubernetes`" in page and "**Default** `./data`" in page


def test_check_mode_fails_on_a_stale_page_and_says_how_to_regenerate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "settings.md"
    stale.write_text(render().replace("Subagent containers at once", "Containers at once"), encoding="utf-8")
    monkeypatch.setattr(settings_reference, "PAGE", stale)

    assert settings_reference.main(["--check"]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert settings_reference.main([]) == 0
    assert settings_reference.main(["--check"]) == 0


def test_from_an_install_it_refuses_in_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    site_packages = tmp_path / "site-packages"  # an installed crewbot: no pyproject.toml beside its packages
    monkeypatch.setattr(settings_reference, "ROOT", site_packages)
    monkeypatch.setattr(settings_reference, "PAGE", site_packages / "docs" / "settings.md")

    assert settings_reference.main([]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert not site_packages.exists()
