"""`crewbot doctor`: one line per check, and a non-zero exit when any check fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from crewbot.doctor import run_doctor
from tests.fakes.llm_server import FakeLLM
from tests.fakes.stt_server import FakeStt
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import make_settings

pytestmark = pytest.mark.docker


async def test_all_checks_pass_against_working_services(tmp_path: Path, subagent_image: str) -> None:
    lines: list[str] = []
    async with FakeTelegram() as tg, FakeLLM(api_key="sk-test-doctor") as llm, FakeStt() as stt:
        settings = make_settings(
            tmp_path,
            tg,
            LLM_PROVIDER="openai",
            LLM_BASE_URL=llm.base_url,
            LLM_API_KEY="sk-test-doctor",
            LLM_MODEL="fake-model",
            STT_BASE_URL=stt.base_url,
        )
        code = await run_doctor(settings, out=lines.append)
    assert code == 0, lines
    names = [line.split()[1] for line in lines]
    # The MCP servers' line last (a skip: no MCP_SERVERS here; tests/crewbot/test_doctor_mcp.py checks servers).
    assert names == [
        "settings",
        "database",
        "telegram",
        "webhook",
        "llm",
        "vision",
        "speech",
        "docker",
        "image",
        "container",
        "pool",  # ok: off (the suite runs without a warm pool; tests/crewbot/test_doctor_pool.py checks one)
        "mcp",
    ]
    assert all(line.startswith("ok") for line in lines[:-1]) and lines[-1].startswith("skip")
    assert "@crew_test_bot" in lines[2]
    assert not any("sk-test-doctor" in line for line in lines)


async def test_failures_are_reported_one_line_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    async with FakeTelegram(token="123:right") as tg:
        settings = make_settings(
            tmp_path,
            tg,
            TELEGRAM_BOT_TOKEN="123:wrong-token",
            LLM_PROVIDER="openai",
            LLM_BASE_URL="http://127.0.0.1:9/v1",  # nothing listens on the discard port
            LLM_API_KEY="sk-test-doctor-key",
            LLM_MODEL="fake-model",
        )
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
        code = await run_doctor(settings, out=lines.append)
    assert code == 1
    status = {line.split()[1]: line.split()[0] for line in lines}
    assert status["database"] == "ok"
    assert status["telegram"] == "FAIL" and status["llm"] == "FAIL" and status["docker"] == "FAIL"
    assert not any("123:wrong-token" in line or "sk-test-doctor-key" in line for line in lines)
