"""`crewbot doctor`: one line per check (settings, database, Telegram, LLM, Docker), non-zero on failure."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from bot.channels.telegram import TelegramChannel
from bot.logging import SecretRedactor
from bot.settings import LLMProvider, Settings
from bot.store.db import Database

CHECK_TIMEOUT_SECONDS = 20.0
CONTAINER_CHECK_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    status: str  # ok, FAIL, skip
    detail: str


async def check_database(settings: Settings) -> CheckResult:
    db = await Database.open(settings.db_path)
    try:
        version = await db.schema_version()
    finally:
        await db.close()
    return CheckResult("ok", f"{settings.db_path} (schema version {version})")


async def check_telegram(settings: Settings) -> CheckResult:
    if settings.telegram_bot_token is None:
        return CheckResult("skip", "TELEGRAM_BOT_TOKEN is not set; `crewbot run` uses the console channel")
    channel = TelegramChannel(settings.telegram_bot_token.get_secret_value(), settings.telegram_api_base_url)
    username = await channel.get_me()
    return CheckResult("ok", f"getMe answered: @{username}")


async def check_llm(settings: Settings) -> CheckResult:
    if settings.llm_provider is LLMProvider.OFFLINE:
        return CheckResult("ok", "offline demo model (no real LLM configured)")
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else ""
    if settings.llm_provider is LLMProvider.OPENAI:
        base = (settings.llm_base_url or "https://api.openai.com/v1").rstrip("/")
        url, headers = f"{base}/models", {"Authorization": f"Bearer {key}"} if key else {}
    else:
        base = (settings.llm_base_url or "https://api.anthropic.com").rstrip("/")
        url, headers = f"{base}/v1/models", {"x-api-key": key, "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(timeout=CHECK_TIMEOUT_SECONDS) as client:
        response = await client.get(url, headers=headers)
    if response.status_code >= 400:
        return CheckResult("FAIL", f"{settings.llm_provider.value} at {base} answered HTTP {response.status_code}")
    return CheckResult("ok", f"{settings.llm_provider.value} at {base} reachable (model {settings.llm_model})")


async def check_docker(settings: Settings) -> list[tuple[str, CheckResult]]:
    from runner.docker_runtime import DockerRuntime
    from runner.paths import container_user
    from runner.runtime import ContainerSpec

    runtime = DockerRuntime(max_concurrency=1)
    results: list[tuple[str, CheckResult]] = []
    try:
        await runtime.ping()
        results.append(("docker", CheckResult("ok", f"engine answers at {runtime.endpoint}")))
        if not await runtime.image_exists(settings.subagent_image):
            results.append(
                ("image", CheckResult("FAIL", f"{settings.subagent_image} missing: run `crewbot image build`"))
            )
            return results
        results.append(("image", CheckResult("ok", settings.subagent_image)))
        spec = ContainerSpec(
            name=f"crewbot-doctor-{secrets.token_hex(4)}",
            image=settings.subagent_image,
            command=["-c", "import sys; print(sys.version.split()[0])"],
            entrypoint=["/opt/venv/bin/python"],
            labels={"crewbot.doctor": "1"},
            mounts=[],
            user=container_user(),
            network=settings.subagent_network,
            memory=settings.subagent_memory,
            cpus=settings.subagent_cpus,
            pids=settings.subagent_pids,
            workdir="/tmp",
        )
        container_id = await runtime.start(spec)
        try:
            code = await runtime.wait(container_id, CONTAINER_CHECK_TIMEOUT_SECONDS)
            output = (await runtime.logs(container_id)).decode(errors="replace").strip()
        finally:
            await runtime.kill(container_id)
            await runtime.remove(container_id)
        if code != 0:
            results.append(("container", CheckResult("FAIL", f"exit code {code}: {output[-200:]}")))
        else:
            results.append(("container", CheckResult("ok", f"started with the subagent limits (Python {output})")))
    finally:
        await runtime.close()
    return results


async def _guard(name: str, check: Callable[[], Awaitable[CheckResult]]) -> tuple[str, CheckResult]:
    try:
        return name, await asyncio.wait_for(check(), CHECK_TIMEOUT_SECONDS)
    except Exception as exc:
        return name, CheckResult("FAIL", f"{type(exc).__name__}: {exc}".strip())


async def run_doctor(settings: Settings, out: Callable[[str], None] = print) -> int:
    results: list[tuple[str, CheckResult]] = [
        ("settings", CheckResult("ok", f"provider {settings.llm_provider.value}, data in {settings.data_dir}"))
    ]
    results.append(await _guard("database", lambda: check_database(settings)))
    results.append(await _guard("telegram", lambda: check_telegram(settings)))
    results.append(await _guard("llm", lambda: check_llm(settings)))
    try:
        results.extend(await asyncio.wait_for(check_docker(settings), CONTAINER_CHECK_TIMEOUT_SECONDS + 10))
    except Exception as exc:
        results.append(("docker", CheckResult("FAIL", f"{type(exc).__name__}: {exc}")))
    # Library errors quote what they were given (a rejected token, say): never print a secret.
    redactor = SecretRedactor(
        value.get_secret_value() for value in (settings.telegram_bot_token, settings.llm_api_key) if value
    )
    for name, result in results:
        out(redactor.scrub(f"{result.status:<4} {name:<9} {result.detail}"))
    return 1 if any(result.status == "FAIL" for _, result in results) else 0
