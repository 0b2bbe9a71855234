"""A just-started bot has not imported the LLM stack: pydantic-ai and the providers' SDKs are loaded by the
first turn or the first subagent run (bench: memory, "host RSS just started")."""

from __future__ import annotations

import subprocess
import sys

# What `python -m crewbot run` imports before its first message, Telegram and subagents included.
START_PATH = ("crewbot.cli", "crewbot.serve", "crewbot.app", "bot.channels.telegram", "runner.service")
LLM_STACK = ("pydantic_ai", "openai", "anthropic", "griffe")


def test_the_start_path_imports_no_llm_library() -> None:
    probe = (
        "import importlib, sys\n"
        f"for name in {START_PATH!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {LLM_STACK!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout[:2000]
