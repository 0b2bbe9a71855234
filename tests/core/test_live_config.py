"""LiveConfig: where each value came from, stored overrides winning at start-up, and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.live_config import LIVE_SETTINGS, LiveConfig, SettingSource, parse_assignments
from core.settings import SettingsError, load_settings
from core.store.db import Database
from core.store.setting_overrides import SettingOverrideStore, now_change


async def test_show_names_the_source_of_every_value(
    tmp_path: Path, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("SUBAGENT_CPUS=1.5\n")
    monkeypatch.setenv("MAX_SUBAGENTS_PER_CHAT", "2")
    settings = load_settings()
    config = LiveConfig(settings, SettingOverrideStore(db))
    await config.set("max_concurrent_subagents", "6", "tester")

    rows = {row.name: row for row in await config.effective()}

    assert (rows["MAX_CONCURRENT_SUBAGENTS"].value, rows["MAX_CONCURRENT_SUBAGENTS"].source) == (
        "6",
        SettingSource.LIVE,
    )
    assert (rows["MAX_SUBAGENTS_PER_CHAT"].value, rows["MAX_SUBAGENTS_PER_CHAT"].source) == ("2", SettingSource.ENV)
    assert (rows["SUBAGENT_CPUS"].value, rows["SUBAGENT_CPUS"].source) == ("1.5", SettingSource.DOTENV)
    assert (rows["SUBAGENT_MEMORY"].value, rows["SUBAGENT_MEMORY"].source) == ("512m", SettingSource.DEFAULT)
    assert {name for name, row in rows.items() if row.live} == set(LIVE_SETTINGS)
    assert len(rows) == len(type(settings).model_fields)


async def test_stored_overrides_win_over_the_environment_at_start(db: Database) -> None:
    store = SettingOverrideStore(db)
    await store.set(now_change("SUBAGENT_MEMORY", "512m", "1g", "earlier"))
    settings = load_settings(_env_file=None, SUBAGENT_MEMORY="256m")

    await LiveConfig(settings, store).load()

    assert settings.subagent_memory == "1g"


async def test_a_stored_value_that_no_longer_validates_stops_start_up_naming_it(db: Database) -> None:
    store = SettingOverrideStore(db)
    await store.set(now_change("SUBAGENT_CPUS", "1", "-2", "someone"))  # written past the validation

    with pytest.raises(SettingsError) as refused:
        await LiveConfig(load_settings(_env_file=None), store).load()

    (line,) = refused.value.lines
    assert line.startswith("invalid setting SUBAGENT_CPUS:") and "crewbot config set" in line


async def test_a_refused_change_changes_nothing(db: Database) -> None:
    settings = load_settings(_env_file=None)
    store = SettingOverrideStore(db)
    with pytest.raises(SettingsError):
        await LiveConfig(settings, store).set("SUBAGENT_TIMEOUT_SECONDS", "0", "tester")
    assert settings.subagent_timeout_seconds == 900 and await store.all() == {} and await store.changes() == []


def test_assignments_must_be_name_equals_value() -> None:
    assert parse_assignments(["max_concurrent_subagents=4", "SUBAGENT_MEMORY=1g"]) == {
        "MAX_CONCURRENT_SUBAGENTS": "4",
        "SUBAGENT_MEMORY": "1g",
    }
    with pytest.raises(ValueError, match="is not NAME=VALUE"):
        parse_assignments(["MAX_CONCURRENT_SUBAGENTS"])
