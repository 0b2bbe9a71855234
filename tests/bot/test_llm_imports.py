"""The host imports only the configured provider's SDK (each is tens of MiB and thousands of modules)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from bot.agent.main_agent import build_main_model
from core.settings import load_settings
import crewbot.app, crewbot.serve, crewbot.cli
build_main_model(load_settings(LLM_PROVIDER=sys.argv[1], LLM_API_KEY="k", LLM_MODEL="m", ALLOWED_CHAT_IDS="1"))
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules} & {"openai", "anthropic"})))
"""


@pytest.mark.parametrize(
    ("provider", "expected"), [("offline", []), ("openai", ["openai"]), ("anthropic", ["anthropic"])]
)
def test_only_the_configured_provider_is_imported(provider: str, expected: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, provider], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected
