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
    (tmp_path / ".env").write_text("SUBAGENT_CPUS=0.5\n")  # within any machine's cores
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
    assert (rows["SUBAGENT_CPUS"].value, rows["SUBAGENT_CPUS"].source) == ("0.5", SettingSource.DOTENV)
    assert (rows["SUBAGENT_MEMORY"].value, rows["SUBAGENT_MEMORY"].source) == ("512m", SettingSource.DEFAULT)
    assert {name for name, row in rows.items() if row.live} == set(LIVE_SETTINGS)
    assert len(rows) == len(type(settings).model_fields)


async def test_stored_overrides_win_over_the_environment_at_start(db: Database) -> None:
    store = SettingOverrideStore(db)
    await store.set(now_change("SUBAGENT_MEMORY", "512m", "1g", "earlier"))
    settings = load_settings(_env_file=None, SUBAGENT_MEMORY="256m")

    await LiveConfig(settings, store).load()

    assert settings.subagent_memory == "1g"


# What an attacker's review found accepted, stored and re-applied at every start; each is refused now.
SWITCHED_OFF = [
    ("SUBAGENT_CPUS", "1e-10", "a number from 0.01 to"),  # NanoCpus 0: no CPU limit
    ("SUBAGENT_CPUS", "1e300", "a number from 0.01 to"),  # every run: cannot convert float infinity
    ("SUBAGENT_CPUS", "nan", "a number from 0.01 to"),
    ("SUBAGENT_TIMEOUT_SECONDS", "inf", "a number from 0.5 to 86400"),  # no wall-clock limit
    ("SUBAGENT_TIMEOUT_SECONDS", "-1", "a number from 0.5 to 86400"),
    ("SUBAGENT_MEMORY", "99999999999999999g", "from 6m to"),  # every spawn failed in the engine
    ("SUBAGENT_MEMORY", "0", "from 6m to"),  # Docker's "no limit"
    ("MAX_CONCURRENT_SUBAGENTS", "-1", "a whole number from 1 to 100"),
    ("SUBAGENT_QUEUE_LIMIT", "1e300", "a whole number from 0 to 1000"),
]


async def test_stored_overrides_that_no_longer_validate_are_refused_at_start_and_the_rest_apply(
    db: Database,
) -> None:
    store = SettingOverrideStore(db)
    for name, value, _ in SWITCHED_OFF:  # written by an older version, whose validation let them through
        await store.set(now_change(name, None, value, "older version"))
    await store.set(now_change("MAX_SUBAGENTS_PER_CHAT", "3", "2", "someone"))
    settings = load_settings(_env_file=None, SUBAGENT_TIMEOUT_SECONDS="600")

    config = LiveConfig(settings, store)
    refused = await config.load()

    stored = {name: value for name, value, _ in SWITCHED_OFF}  # the last value of each name stays stored
    assert len(refused) == len(stored)
    for line, (name, value) in zip(refused, sorted(stored.items()), strict=True):
        expected = next(ranged for n, v, ranged in SWITCHED_OFF if (n, v) == (name, value))
        assert line.startswith(f"invalid setting {name}: must be ") and expected in line and repr(value) in line
        assert "live override stored by `crewbot config set` is not applied" in line
    settings_kept = (settings.subagent_cpus, settings.subagent_timeout_seconds, settings.subagent_memory)
    assert settings_kept == (1.0, 600.0, "512m")  # the environment's values, not the stored ones
    assert (settings.max_concurrent_subagents, settings.subagent_queue_limit) == (3, 20)
    assert settings.max_subagents_per_chat == 2  # a valid override beside them still applies
    rows = {row.name: row.source for row in await config.effective()}
    assert (rows["SUBAGENT_CPUS"], rows["MAX_SUBAGENTS_PER_CHAT"]) == (SettingSource.DEFAULT, SettingSource.LIVE)


@pytest.mark.parametrize(("name", "value", "expected"), SWITCHED_OFF)
async def test_a_live_change_that_would_switch_a_limit_off_is_refused(
    db: Database, name: str, value: str, expected: str
) -> None:
    settings = load_settings(_env_file=None)
    before = settings.model_dump()
    store = SettingOverrideStore(db)

    with pytest.raises(SettingsError) as refused:
        await LiveConfig(settings, store).set(name, value, "tester")

    (line,) = refused.value.lines
    assert line.startswith(f"invalid setting {name}: must be ") and expected in line and f"(got {value!r})" in line
    assert settings.model_dump() == before and await store.all() == {} and await store.changes() == []


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
