"""No setting switches a limit off: every numeric setting has a documented range, checked at start-up
(environment and `.env`) with one line naming the variable and the whole range; CPUs and memory are
bounded by the machine, measured when a value is validated (here a machine of 4 cores and 2 GiB)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.settings import Settings, SettingsError, load_settings

HOST_CORES = 4
HOST_PAGES = 524_288  # 2 GiB of 4 KiB pages
PAGE_BYTES = 4_096

# The documented ranges (docs/settings.md shows the same bounds): a new numeric setting must say its own.
RANGES = {
    "LLM_TIMEOUT_SECONDS": "a number from 1 to 3600",
    "MAX_CONCURRENT_SUBAGENTS": "a whole number from 1 to 100",
    "MAX_SUBAGENTS_PER_CHAT": "a whole number from 1 to 100",
    "SUBAGENT_TIMEOUT_SECONDS": "a number from 0.5 to 86400",
    "SUBAGENT_ASK_TIMEOUT_SECONDS": "a number from 1 to 86400",
    "SUBAGENT_MAX_QUESTIONS": "a whole number from 0 to 100",
    "SUBAGENT_QUEUE_LIMIT": "a whole number from 0 to 1000",
    "MAX_CONCURRENT_TURNS": "a whole number from 1 to 1000",
    "MERGE_WINDOW_SECONDS": "a number from 0 to 300",
    "TYPING_INTERVAL_SECONDS": "a number from 0.2 to 60",
    "STREAM_EDIT_INTERVAL_SECONDS": "a number from 1 to 30",
    "STREAM_DRAFT_INTERVAL_SECONDS": "a number from 1 to 30",
    "STREAM_EDITS_PER_SECOND": "a number from 1 to 20",  # Telegram's 30 a second less room for the outbox
    "VISION_MAX_IMAGES": "a whole number from 0 to 10",
    "STT_MAX_SECONDS": "a whole number from 1 to 14400",
    "STT_PRICE_PER_MINUTE": "a number from 0 to 100",
    "HISTORY_WINDOW_MESSAGES": "a whole number from 1 to 1000",
    "MEMORY_MAX_NOTES": "a whole number from 1 to 500",
    "MEMORY_MAX_MEMBER_NOTES": "a whole number from 1 to 200",
    "MEMORY_NOTE_CHARS": "a whole number from 20 to 4000",
    "MEMORY_PROMPT_CHARS": "a whole number from 500 to 100000",
    "HISTORY_SEARCH_RESULTS": "a whole number from 1 to 50",
    "SUBAGENT_CPUS": f"a number from 0.01 to {HOST_CORES} (this host's CPU cores)",
    "SUBAGENT_PIDS": "a whole number from 16 to 32768",
    "SUBAGENT_MAX_TOKENS": "a whole number from 1000 to 10000000",
    "SUBAGENT_MAX_MESSAGES": "a whole number from 0 to 1000",
    "SUBAGENT_SESSION_MAX_MESSAGES": "a whole number from 0 to 10000",
    "SUBAGENT_MAX_FILE_MB": "a whole number from 1 to 50",
    "SUBAGENT_MAX_FILES": "a whole number from 0 to 50",
    "SUBAGENT_RUN_FILES_MB": "a whole number from 1 to 1000",
    "SUBAGENT_EGRESS_MAX_MB": "a whole number from 1 to 100000",
    "CHAT_DAILY_TOKENS": "a whole number from 0 to 1000000000000",
    "DAILY_TOKENS": "a whole number from 0 to 1000000000000",
    "LLM_PRICE_INPUT_PER_MTOK": "a number from 0 to 10000",
    "LLM_PRICE_OUTPUT_PER_MTOK": "a number from 0 to 10000",
    "SUBAGENT_EGRESS_MAX_CONNECTIONS": "a whole number from 1 to 256",
    "WORKSPACE_QUOTA_MB": "a whole number from 1 to 1048576",
    "KUBE_JOB_TTL_SECONDS": "a whole number from 0 to 604800",
    "DATA_RETENTION_DAYS": "a number from 0.01 to 3650",
    "IPC_RESCAN_SECONDS": "a number from 0.5 to 300",
    "IPC_MAX_FILE_BYTES": "a whole number from 1024 to 16777216",
    "SCHEDULE_MIN_INTERVAL_SECONDS": "a whole number from 1 to 604800",
    "SCHEDULE_MISFIRE_GRACE_SECONDS": "a whole number from 1 to 86400",
    "SCHEDULE_MAX_FAILURES": "a whole number from 1 to 100",
    "MAX_TASKS_PER_CHAT": "a whole number from 1 to 1000",
    "SUBAGENT_MCP_MAX_CALLS": "a whole number from 0 to 10000",
    "SUBAGENT_MCP_MAX_RESULT_MB": "a number from 0 to 100",
    "SUBAGENT_WARM_POOL": "a whole number from 0 to 20",
}
MEMORY_RANGE = "from 6m to 2048m (this host's memory)"


def bounds(name: str) -> tuple[str, str]:
    low, high = RANGES[name].split(" from ")[1].split(" (")[0].split(" to ")
    return low, high


def out_of_range(name: str) -> list[str]:
    low, high = (float(word) for word in bounds(name))
    step = 1 if RANGES[name].startswith("a whole") else low / 2 or 0.001
    below = f"{int(low - step)}" if step == 1 else f"{low - step:g}"
    above = f"{int(high + 1)}"
    return [below, above, "-1", "1e300", "-1e300", "inf", "-inf", "nan", "", "abc"]


@pytest.fixture(autouse=True)
def _small_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty working directory (no stray `.env`) on a machine of 4 cores and 2 GiB, whatever runs this."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "cpu_count", lambda: HOST_CORES)
    real_sysconf = os.sysconf
    sizes = {"SC_PHYS_PAGES": HOST_PAGES, "SC_PAGE_SIZE": PAGE_BYTES}
    monkeypatch.setattr(os, "sysconf", lambda name: sizes.get(str(name)) or real_sysconf(name))


def refusal(**env: str) -> str:
    with pytest.raises(SettingsError) as raised:
        load_settings(_env_file=None, **env)
    (line,) = raised.value.lines
    return line


def test_every_numeric_setting_has_a_documented_range() -> None:
    numeric = {str(f.alias) for f in Settings.model_fields.values() if f.annotation in (int, float)}

    assert numeric == set(RANGES)


@pytest.mark.parametrize(("name", "value"), [(name, value) for name in RANGES for value in out_of_range(name)])
def test_out_of_range_is_one_line_naming_the_variable_and_its_range(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)

    with pytest.raises(SettingsError) as raised:
        load_settings()

    assert raised.value.lines == [f"invalid setting {name}: must be {RANGES[name]} (got {value!r})"]


@pytest.mark.parametrize("name", list(RANGES))
def test_both_ends_of_a_range_are_accepted(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    field = {str(f.alias): key for key, f in Settings.model_fields.items()}[name]
    for end in bounds(name):
        monkeypatch.setenv(name, end)
        assert getattr(load_settings(), field) == float(end)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SUBAGENT_CPUS", "1e-10"),  # NanoCpus 0: no CPU limit at all
        ("SUBAGENT_CPUS", "1e300"),  # every run failed: cannot convert float infinity to integer
        ("SUBAGENT_CPUS", "4.01"),
        ("SUBAGENT_TIMEOUT_SECONDS", "inf"),  # no wall-clock limit
        ("SUBAGENT_TIMEOUT_SECONDS", "nan"),
        ("DATA_RETENTION_DAYS", "inf"),  # nothing is ever deleted
        ("SUBAGENT_MAX_TOKENS", "99999999999999999999999"),
    ],
)
def test_the_values_that_switched_a_limit_off_are_refused_from_the_dotenv_file(
    tmp_path: Path, name: str, value: str
) -> None:
    (tmp_path / ".env").write_text(f"{name}={value}\n", encoding="utf-8")

    with pytest.raises(SettingsError) as raised:
        load_settings()

    assert raised.value.lines == [f"invalid setting {name}: must be {RANGES[name]} (got {value!r})"]


def test_cpus_up_to_the_hosts_cores_are_accepted_and_the_bound_is_measured_at_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings(_env_file=None, SUBAGENT_CPUS="4").subagent_cpus == 4.0

    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # the same value on a smaller machine

    assert refusal(SUBAGENT_CPUS="4") == (
        "invalid setting SUBAGENT_CPUS: must be a number from 0.01 to 2 (this host's CPU cores) (got '4')"
    )


@pytest.mark.parametrize(
    "value",
    [
        "99999999999999999g",  # past int64: every spawn failed in the engine
        "9223372036854775808",  # int64's maximum plus one
        "2049m",  # more than the host has
        "3g",
        "0",  # Docker's "no limit"
        "5m",  # under the engine's minimum
        "-1g",
        "inf",
        "1" * 5000,  # past Python's int-from-text limit: still the same line
        "lots",
    ],
)
def test_subagent_memory_is_bounded_by_int64_and_the_hosts_memory(value: str) -> None:
    assert refusal(SUBAGENT_MEMORY=value) == (
        "invalid setting SUBAGENT_MEMORY: must be digits with an optional unit b, k, m or g, "
        f"{MEMORY_RANGE} (got {value[:60]!r})"
    )


@pytest.mark.parametrize("value", ["2g", "2048m", "6m", "2147483648"])
def test_subagent_memory_up_to_the_hosts_memory_is_accepted(value: str) -> None:
    assert load_settings(_env_file=None, SUBAGENT_MEMORY=value).subagent_memory == value
