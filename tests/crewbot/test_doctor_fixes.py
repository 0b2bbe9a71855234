"""`crewbot doctor` against fakes that fail in each way: every FAIL line says what was tried and ends in a fix,
checks that cannot run are shown as skipped, and no secret is printed. No Docker engine needed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from crewbot.doctor import run_doctor
from runner.runtimes.docker_runtime import DockerRuntime
from runner.runtimes.runtime import ContainerStartError
from tests.crewbot.cli_env import SECRET_TOKEN, crewbot_env, run_crewbot
from tests.fakes.llm_server import FakeLLM
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.fakes.stt_server import FakeStt
from tests.fakes.telegram_server import FakeTelegram
from tests.harness import make_settings

API_KEY = "sk-doctor-secret-0123456789"
IMAGE = "crewbot-agent:latest"


def by_name(lines: list[str]) -> dict[str, str]:
    return {line.split()[1]: line for line in lines}


def assert_fixes(lines: list[str]) -> None:
    """Every failing line carries its fix; nothing secret is shown."""
    for line in lines:
        if line.startswith("FAIL"):
            assert "; fix: " in line and not line.endswith("; fix: "), line
        assert SECRET_TOKEN not in line and API_KEY not in line


async def prints_python(container: MemoryContainer) -> int | None:
    container.logs = b"3.11.2\n"
    return 0


async def crashes(container: MemoryContainer) -> int | None:
    container.logs = b"Traceback (most recent call last):\nModuleNotFoundError: No module named 'container'\n"
    return 1


async def doctor(tmp_path: Path, runtime: MemoryRuntime | DockerRuntime, **settings: object) -> list[str]:
    lines: list[str] = []
    code = await run_doctor(make_settings(tmp_path / "data", None, **settings), out=lines.append, runtime=runtime)
    assert code == (1 if any(line.startswith("FAIL") for line in lines) else 0)
    assert_fixes(lines)
    return lines


async def test_everything_answering_is_all_ok(tmp_path: Path) -> None:
    async with (
        FakeTelegram() as tg,
        FakeStt() as stt,
        MemoryRuntime(images={IMAGE}, on_start=prints_python) as runtime,
    ):
        lines = await doctor(
            tmp_path, runtime, TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, STT_BASE_URL=stt.base_url
        )

    names = (
        *("settings", "database", "telegram", "webhook", "llm", "vision", "speech", "docker", "image", "container"),
        "pool",  # off in the suite
    )
    assert [line.split()[:2] for line in lines] == [["ok", name] for name in names] + [
        ["skip", "mcp"]  # no MCP_SERVERS: no servers to check (tests/crewbot/test_doctor_mcp.py)
    ]


@asynccontextmanager
async def provider_answering(status: int) -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1 that answers every request with `status`, as a provider refusing a key."""

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "Incorrect API key provided."}}, status=status)

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


async def test_a_rejected_token_and_a_refused_key(tmp_path: Path) -> None:
    async with (
        FakeTelegram() as tg,
        provider_answering(401) as llm_url,
        MemoryRuntime(images={IMAGE}, on_start=prints_python) as runtime,
    ):
        telegram_url = tg.base_url
        lines = by_name(
            await doctor(
                tmp_path,
                runtime,
                TELEGRAM_BOT_TOKEN=SECRET_TOKEN,
                TELEGRAM_API_BASE_URL=telegram_url,
                LLM_PROVIDER="openai",
                LLM_BASE_URL=llm_url,
                LLM_API_KEY=API_KEY,
                LLM_MODEL="fake-model",
            )
        )

    assert lines["telegram"].startswith(
        f"FAIL telegram  Telegram rejected TELEGRAM_BOT_TOKEN ({telegram_url}<token>/getMe"
    )
    assert "fix: copy the token again from @BotFather" in lines["telegram"]
    assert f"{llm_url}/models answered HTTP 401: the key was refused" in lines["llm"]
    assert "fix: set LLM_API_KEY to a valid openai key" in lines["llm"]


async def test_nothing_listening(tmp_path: Path) -> None:
    async with MemoryRuntime(images={IMAGE}, on_start=prints_python) as runtime:
        lines = by_name(
            await doctor(
                tmp_path,
                runtime,
                TELEGRAM_BOT_TOKEN=SECRET_TOKEN,
                TELEGRAM_API_BASE_URL="http://127.0.0.1:9/bot",
                LLM_PROVIDER="openai",
                LLM_BASE_URL="http://127.0.0.1:9/v1",
                LLM_MODEL="fake-model",
            )
        )

    assert "cannot reach the Telegram Bot API at http://127.0.0.1:9/bot<token>/getMe" in lines["telegram"]
    assert "fix: check the network or proxy, and TELEGRAM_API_BASE_URL" in lines["telegram"]
    assert "cannot reach http://127.0.0.1:9/v1/models (ConnectError" in lines["llm"]
    assert "fix: start the model server, or correct LLM_BASE_URL" in lines["llm"]


async def test_an_llm_base_url_without_the_api(tmp_path: Path) -> None:
    async with FakeLLM() as llm, MemoryRuntime(images={IMAGE}, on_start=prints_python) as runtime:
        wrong = llm.base_url.removesuffix("/v1")  # the classic: the /v1 left out
        lines = by_name(
            await doctor(tmp_path, runtime, LLM_PROVIDER="openai", LLM_BASE_URL=wrong, LLM_MODEL="fake-model")
        )

    assert f"FAIL llm       {wrong}/models answered HTTP 404" in lines["llm"]
    assert "fix: LLM_BASE_URL is the API's base, e.g. http://127.0.0.1:8000/v1" in lines["llm"]


async def test_no_engine_shows_the_image_and_container_checks_as_skipped(tmp_path: Path) -> None:
    runtime = DockerRuntime(max_concurrency=1, base_url=f"unix://{tmp_path}/no-engine.sock")
    try:
        lines = by_name(await doctor(tmp_path, runtime))
    finally:
        await runtime.close()

    assert lines["docker"].startswith(f"FAIL docker    no engine answers at unix://{tmp_path}/no-engine.sock")
    assert "fix: `make engine` installs and starts one" in lines["docker"]
    assert lines["image"] == "skip image     not checked: no Docker engine"
    assert lines["container"] == "skip container not checked: no Docker engine"


async def test_a_missing_image(tmp_path: Path) -> None:
    async with MemoryRuntime(images=set()) as runtime:
        lines = by_name(await doctor(tmp_path, runtime))

    assert lines["image"] == (
        f"FAIL image     {IMAGE} is not on the engine; fix: `crewbot image build` (about 600 MB, a few minutes)"
    )
    assert lines["container"] == "skip container not checked: no image"


async def test_a_container_that_crashes(tmp_path: Path) -> None:
    async with MemoryRuntime(images={IMAGE}, on_start=crashes) as runtime:
        lines = by_name(await doctor(tmp_path, runtime))

    assert "FAIL container a test container exited with code 1: " in lines["container"]
    assert "No module named 'container'" in lines["container"]
    assert lines["container"].endswith("fix: rebuild the image: `crewbot image build --force`")


async def test_limits_the_engine_refuses(tmp_path: Path) -> None:
    async with MemoryRuntime(images={IMAGE}) as runtime:
        runtime.fail_next_start(ContainerStartError("Minimum memory limit allowed is 6MB"))
        lines = by_name(await doctor(tmp_path, runtime))

    assert "the engine refused a test container (Minimum memory limit allowed is 6MB)" in lines["container"]
    assert "fix: check SUBAGENT_MEMORY, SUBAGENT_CPUS, SUBAGENT_PIDS and SUBAGENT_NETWORK" in lines["container"]


async def test_a_data_dir_that_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    lines: list[str] = []
    async with MemoryRuntime(images={IMAGE}, on_start=prints_python) as runtime:
        settings = make_settings(tmp_path / "a-file" / "data")
        await run_doctor(settings, out=lines.append, runtime=runtime)

    assert_fixes(lines)
    assert "FAIL database  DATA_DIR" in by_name(lines)["database"]
    assert "fix: set DATA_DIR to a folder this user can write" in by_name(lines)["database"]


@pytest.mark.parametrize(("name", "value"), [("SUBAGENT_MEMORY", "lots"), ("ALLOWED_CHAT_IDS", "abc")])
def test_settings_that_do_not_load(tmp_path: Path, name: str, value: str) -> None:
    env = crewbot_env(tmp_path / "data", TELEGRAM_BOT_TOKEN=SECRET_TOKEN, **{name: value})

    done = run_crewbot(["doctor"], env, tmp_path)

    assert done.returncode == 1
    [line] = done.stdout.strip().splitlines()
    assert line.startswith(f"FAIL settings  {name}: ")
    assert line.endswith("; fix: correct it in .env or the environment (.env.example lists every setting)")
    assert SECRET_TOKEN not in done.stdout + done.stderr
