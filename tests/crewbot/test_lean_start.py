"""A just-started bot has not imported the LLM stack: pydantic-ai and the providers' SDKs are loaded by the
first turn or the first subagent run (bench: memory, "host RSS just started"); nor the SDKs of features it does
not use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.crewbot.cli_env import COMMAND_WAIT_SECONDS, crewbot_env, start_crewbot, until_logged
from tests.fakes.telegram_server import FakeTelegram

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


# Not imported by a start with no MCP server configured, no photo or voice, nor in a production install: the MCP
# SDK (core/mcp_sdk.py, at a configured server's first use), what python-telegram-bot and httpx import only for
# features the bot does not use (core/lean_import.py), the LLM stack, the Kubernetes client, the image library.
NOT_AT_START = (
    "mcp",
    "mcp_types",
    "starlette",
    "uvicorn",
    "cryptography",
    "click",
    "pygments",
    "rich",
    *LLM_STACK,
    "kubernetes",
    "PIL",
)
# `crewbot run` as `python -m crewbot run` runs it (crewbot.cli.main without its os._exit), then the names of the
# modules it imported into the file named by its argument (it is stopped once started, before any message).
RUN_AND_LIST = (
    "import json, os, sys\n"
    "from crewbot.cli import run\n"
    "code = run(['run'])\n"
    "open(sys.argv[1], 'w').write(json.dumps(sorted(sys.modules)))\n"
    "os._exit(code)\n"
)


def test_the_real_command_starts_without_the_sdks_of_features_not_in_use(tmp_path: Path) -> None:
    """The real command against the fake Telegram, stopped (SIGTERM) once it logged `crewbot_started`."""
    data_dir, output, listed = tmp_path / "data", tmp_path / "stderr.txt", tmp_path / "modules.json"
    with FakeTelegram() as tg, output.open("w") as stderr:
        env = crewbot_env(data_dir, TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url)
        bot = start_crewbot(["-c", RUN_AND_LIST, str(listed)], env, tmp_path, stderr)
        try:
            until_logged(bot, output, "crewbot_started")
        finally:
            bot.terminate()  # our own child, by its handle
            bot.wait(COMMAND_WAIT_SECONDS)
    imported = json.loads(listed.read_text())
    assert "bot.channels.telegram" in imported and "runner.service" in imported  # the list is the bot's
    assert [m for m in imported if m.split(".")[0] in NOT_AT_START] == []
