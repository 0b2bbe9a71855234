"""`crewbot doctor`: one line per check (settings, database, Telegram and its webhook, LLM, images and speech to
text, Docker, SUBAGENT_RUNTIME_CLASS when set, and each MCP server), non-zero on failure.

A failing line says what was tried (the URL, the engine's address) and ends in `fix: …`; a check that
cannot run because an earlier one failed is shown as `skip` with the reason, never left out.
"""

from __future__ import annotations

import asyncio
import platform
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import httpx

from core.logging import SecretRedactor
from core.setting_runtime import RuntimeKind
from core.settings import LLMProvider, Settings
from core.store.db import Database
from crewbot.doctor_result import CheckResult, fail, probe_outcome, render
from crewbot.doctor_senses import check_stt, check_vision
from crewbot.startup import (
    IntegrityCheck,
    StartupError,
    check_data_dir,
    database_problem,
    secrets_of,
    telegram_problem,
)
from crewbot.startup import check_database as check_database_file
from crewbot.webhook_doctor import WebhookFacts, webhook_verdict

if TYPE_CHECKING:
    from runner.runtimes.runtime import ContainerRuntime, ContainerSpec

CHECK_TIMEOUT_SECONDS = 20.0
CONTAINER_CHECK_TIMEOUT_SECONDS = 60.0
HTTP_UNAUTHORIZED, HTTP_FORBIDDEN, HTTP_NOT_FOUND, HTTP_ERRORS_FROM = 401, 403, 404, 400
MAX_OUTPUT_SHOWN_CHARS = 200
ENGINE_FIX = "`make engine` installs and starts one (Debian, as root), or start Docker; DOCKER_HOST says where to look"
SETTINGS_FIX = "correct it in .env or the environment (.env.example lists every setting)"


def _reason(exc: BaseException) -> str:
    words = " ".join(str(exc).split()) or type(exc).__name__
    return words[:MAX_OUTPUT_SHOWN_CHARS]


async def check_database(settings: Settings) -> CheckResult:
    try:
        await asyncio.to_thread(check_data_dir, settings.data_dir)
        # The full check (every index against its table), in a thread: it reads the whole file.
        await asyncio.to_thread(check_database_file, settings.db_path, IntegrityCheck.FULL)
        db = await Database.open(settings.db_path)
    except StartupError as exc:
        return fail(exc.cause, exc.fix)
    except Exception as exc:
        return fail(*database_problem(settings.db_path, exc))
    try:
        version = await db.schema_version()
    finally:
        await db.close()
    return CheckResult("ok", f"{settings.db_path} (schema version {version}, {IntegrityCheck.FULL} ok)")


async def check_telegram(settings: Settings) -> CheckResult:
    if settings.telegram_bot_token is None:
        return CheckResult("skip", "TELEGRAM_BOT_TOKEN is not set; `crewbot run` uses the console channel")
    from bot.channels.telegram import TelegramChannel

    channel = TelegramChannel(settings.telegram_bot_token.get_secret_value(), settings.telegram_api_base_url)
    url = f"{settings.telegram_api_base_url}<token>/getMe"
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            username = await channel.get_me()
    except TimeoutError:
        return fail(f"no answer from {url} within {CHECK_TIMEOUT_SECONDS:.0f} s", "check the network or proxy")
    except Exception as exc:
        problem = telegram_problem(exc, settings.telegram_api_base_url)
        if problem is None:
            return fail(f"getMe at {url} failed ({_reason(exc)})", "check TELEGRAM_BOT_TOKEN and TELEGRAM_API_BASE_URL")
        return fail(*problem)
    return CheckResult("ok", f"getMe answered: @{username}")


async def check_webhook(settings: Settings) -> CheckResult:
    """getWebhookInfo against the mode the settings ask for (webhook_doctor says what is wrong and the fix)."""
    if settings.telegram_bot_token is None:
        return CheckResult("skip", "TELEGRAM_BOT_TOKEN is not set")
    from telegram import Bot

    bot = Bot(settings.telegram_bot_token.get_secret_value(), base_url=settings.telegram_api_base_url)
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS), bot:
            info = await bot.get_webhook_info()
    except Exception as exc:
        url = f"{settings.telegram_api_base_url}<token>/getWebhookInfo"
        return fail(f"{url} failed ({_reason(exc) if str(exc) else 'no answer'})", "check the network or proxy")
    error_at = info.last_error_date.timestamp() if info.last_error_date is not None else None
    facts = WebhookFacts(info.url, info.pending_update_count, error_at, info.last_error_message)
    return CheckResult(*webhook_verdict(facts, settings.telegram_webhook_url, settings.telegram_webhook_listen))


def _models_request(settings: Settings) -> tuple[str, dict[str, str]]:
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else ""
    if settings.llm_provider is LLMProvider.OPENAI:
        base = (settings.llm_base_url or "https://api.openai.com/v1").rstrip("/")
        return f"{base}/models", {"Authorization": f"Bearer {key}"} if key else {}
    base = (settings.llm_base_url or "https://api.anthropic.com").rstrip("/")
    return f"{base}/v1/models", {"x-api-key": key, "anthropic-version": "2023-06-01"}


async def check_llm(settings: Settings) -> CheckResult:
    if settings.llm_provider is LLMProvider.OFFLINE:
        return CheckResult("ok", "offline demo model (no real LLM configured; LLM_PROVIDER picks one)")
    provider = settings.llm_provider.value
    url, headers = _models_request(settings)
    where = "start the model server, or correct LLM_BASE_URL" if settings.llm_base_url else "check the network or proxy"
    try:
        async with httpx.AsyncClient(timeout=CHECK_TIMEOUT_SECONDS) as client:
            response = await client.get(url, headers=headers)
    except httpx.TimeoutException:
        return fail(f"no answer from {url} within {CHECK_TIMEOUT_SECONDS:.0f} s", where)
    except httpx.HTTPError as exc:
        return fail(f"cannot reach {url} ({type(exc).__name__}: {_reason(exc)})", where)
    code = response.status_code
    if code in (HTTP_UNAUTHORIZED, HTTP_FORBIDDEN):
        return fail(f"{url} answered HTTP {code}: the key was refused", f"set LLM_API_KEY to a valid {provider} key")
    if code == HTTP_NOT_FOUND:
        return fail(
            f"{url} answered HTTP 404: no API there",
            "LLM_BASE_URL is the API's base, e.g. http://127.0.0.1:8000/v1 for an OpenAI-compatible server",
        )
    if code >= HTTP_ERRORS_FROM:
        return fail(f"{url} answered HTTP {code}", "check LLM_BASE_URL and the provider's status")
    return CheckResult("ok", f"{provider} at {url} answered (model {settings.llm_model})")


def _engine_reason(exc: BaseException) -> str:
    text = str(exc)
    for marker, reason in (
        ("No such file or directory", "no socket there"),
        ("Connection refused", "connection refused"),
        ("Permission denied", "permission denied: run as root or join the docker group"),
        ("timed out", "timed out"),
    ):
        if marker in text:
            return reason
    return _reason(exc)[:120]


def _probe_spec(settings: Settings, code: str, runtime_class: str | None = None) -> ContainerSpec:
    """A tiny container of the subagent image running `python -c code`, with the subagent limits and network."""
    from runner.runtimes.runtime import ContainerSpec
    from runner.storage.paths import container_user

    return ContainerSpec(
        name=f"crewbot-doctor-{secrets.token_hex(4)}",
        image=settings.subagent_image,
        command=["-c", code],
        entrypoint=["/opt/venv/bin/python"],
        labels={"crewbot.doctor": "1"},
        mounts=[],
        user=container_user(),
        network=settings.subagent_network,
        memory=settings.subagent_memory,
        cpus=settings.subagent_cpus,
        pids=settings.subagent_pids,
        workdir="/tmp",
        runtime_class=runtime_class,
    )


async def _container_check(
    settings: Settings, runtime: ContainerRuntime, runtime_class: str | None = None
) -> CheckResult:
    from runner.runtimes.runtime import ContainerStartError

    spec = _probe_spec(settings, "import sys; print(sys.version.split()[0])", runtime_class)
    rebuild = "rebuild the image: `crewbot image build --force`"
    try:
        container_id = await runtime.start(spec)
    except ContainerStartError as exc:
        return fail(
            f"the engine refused a test container ({_reason(exc)})",
            "check SUBAGENT_MEMORY, SUBAGENT_CPUS, SUBAGENT_PIDS and SUBAGENT_NETWORK",
        )
    code, output = await probe_outcome(runtime, container_id, CONTAINER_CHECK_TIMEOUT_SECONDS)
    if code is None:
        return fail(
            f"a test container did not finish within {CONTAINER_CHECK_TIMEOUT_SECONDS:.0f} s",
            "the engine may be overloaded: look at `docker ps`",
        )
    if code != 0:
        return fail(f"a test container exited with code {code}: {output[-MAX_OUTPUT_SHOWN_CHARS:]}", rebuild)
    return CheckResult("ok", f"started with the subagent limits (Python {output})")


async def _runtime_class_check(settings: Settings, runtime: ContainerRuntime, runtime_class: str) -> CheckResult:
    """A tiny container of the subagent image under SUBAGENT_RUNTIME_CLASS, with the subagent limits and network:
    the engine knowing the name is not enough (gVisor may be registered but unable to start here)."""
    from runner.runtimes.docker_runtime import RUNTIME_CLASS_FIX, UnknownRuntimeClass
    from runner.runtimes.runtime import ContainerStartError

    spec = _probe_spec(settings, "import platform; print(platform.release())", runtime_class)
    engine_log = "see the engine's log (/var/log/crewbot-dockerd.log when `make engine` started it)"
    try:
        container_id = await runtime.start(spec)
    except UnknownRuntimeClass:
        return fail(f"the engine has no runtime {runtime_class!r} (SUBAGENT_RUNTIME_CLASS)", RUNTIME_CLASS_FIX)
    except ContainerStartError as exc:
        return fail(f"the engine could not start a container under {runtime_class} ({_reason(exc)})", engine_log)
    code, output = await probe_outcome(runtime, container_id, CONTAINER_CHECK_TIMEOUT_SECONDS)
    if code != 0:
        ended = "did not finish in time" if code is None else f"exited with code {code}"
        return fail(
            f"a test container under {runtime_class} {ended}: {output[-MAX_OUTPUT_SHOWN_CHARS:]}",
            # gVisor's sandbox counts its own threads against the pids limit: too low a limit kills forks.
            f"{engine_log}; under gVisor SUBAGENT_PIDS also counts the sandbox's own threads: raise it",
        )
    host = platform.release()
    kernel = "the host's own kernel" if output == host else f"its own kernel {output}, not the host's {host}"
    return CheckResult("ok", f"{runtime_class}: a test container started under it ({kernel})")


async def _image_check(settings: Settings, runtime: ContainerRuntime) -> CheckResult:
    """The image, whether it is current (its sources, base and SUBAGENT_IMAGE_PACKAGES/APT), and its tools."""
    from runner.runtimes.image import LABEL_CONTENT_HASH, ImageBuildError, status_from_labels
    from runner.runtimes.image_tools import ImageTools, describe_tools

    image = settings.subagent_image
    labels_of: Callable[[str], Awaitable[dict[str, str] | None]] | None = getattr(runtime, "image_labels", None)
    if labels_of is None:  # a runtime that cannot show labels: the image is there, that is all we know
        return CheckResult("ok", image)
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            labels = await labels_of(image) or {}
    except Exception as exc:
        return fail(f"cannot ask the engine for the labels of {image} ({_reason(exc)})", ENGINE_FIX)
    tools = describe_tools(labels)
    if LABEL_CONTENT_HASH not in labels:
        return CheckResult("ok", f"{image}: not made by `crewbot image build` (freshness and tools unknown)")
    wanted = ImageTools.of(settings.subagent_image_packages, settings.subagent_image_apt)
    try:
        status = await asyncio.to_thread(status_from_labels, labels, wanted)
    except ImageBuildError:  # an installed crewbot has no sources to hash
        return CheckResult("ok", f"{image}: not checked for staleness (no source checkout); {tools}")
    if status != "current":
        return fail(
            f"{image} is stale: built from other sources, another base or other tools than "
            f"SUBAGENT_IMAGE_PACKAGES/SUBAGENT_IMAGE_APT ask for; it holds {tools}",
            "`crewbot image build` (`make run` rebuilds it too)",
        )
    return CheckResult("ok", f"{image}: current; {tools}")


async def check_docker(settings: Settings, runtime: ContainerRuntime) -> list[tuple[str, CheckResult]]:
    endpoint = getattr(runtime, "endpoint", "the Docker engine")
    image = settings.subagent_image
    runtime_class = settings.subagent_runtime_class if settings.subagent_runtime is RuntimeKind.DOCKER else None
    after_container = ["container"] + (["runtime"] if runtime_class is not None else [])
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            await runtime.ping()
    except Exception as exc:
        down = fail(f"no engine answers at {endpoint} ({_engine_reason(exc)})", ENGINE_FIX)
        skipped = CheckResult("skip", "not checked: no Docker engine")
        return [("docker", down), *((name, skipped) for name in ["image", *after_container])]
    results = [("docker", CheckResult("ok", f"engine answers at {endpoint}"))]
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
            present = await runtime.image_exists(image)
    except Exception as exc:
        present = False
        results.append(("image", fail(f"cannot ask the engine for {image} ({_reason(exc)})", ENGINE_FIX)))
    else:
        if present:
            results.append(("image", await _image_check(settings, runtime)))
        else:
            results.append(
                ("image", fail(f"{image} is not on the engine", "`crewbot image build` (about 600 MB, a few minutes)"))
            )
    if not present:
        return [*results, *((name, CheckResult("skip", "not checked: no image")) for name in after_container)]
    try:
        async with asyncio.timeout(CONTAINER_CHECK_TIMEOUT_SECONDS + CHECK_TIMEOUT_SECONDS):
            results.append(("container", await _container_check(settings, runtime)))
    except Exception as exc:
        results.append(("container", fail(f"a test container could not be run ({_reason(exc)})", ENGINE_FIX)))
    if runtime_class is not None:
        try:
            async with asyncio.timeout(CONTAINER_CHECK_TIMEOUT_SECONDS + CHECK_TIMEOUT_SECONDS):
                results.append(("runtime", await _runtime_class_check(settings, runtime, runtime_class)))
        except Exception as exc:
            results.append(("runtime", fail(f"a test container could not be run ({_reason(exc)})", ENGINE_FIX)))
    return results


async def _docker_checks(settings: Settings, runtime: ContainerRuntime | None) -> list[tuple[str, CheckResult]]:
    if runtime is not None:
        return await check_docker(settings, runtime)
    from runner.runtimes.docker_runtime import DockerRuntime

    owned = DockerRuntime(max_concurrency=1)
    try:
        return await check_docker(settings, owned)
    finally:
        await owned.close()


async def _guard(name: str, check: Callable[[], Awaitable[CheckResult]]) -> tuple[str, CheckResult]:
    try:
        return name, await asyncio.wait_for(check(), CHECK_TIMEOUT_SECONDS + 5)
    except Exception as exc:  # a check's own bug must not hide the others
        return name, fail(f"the check itself failed ({type(exc).__name__}: {_reason(exc)})", "report this as a bug")


def report_bad_settings(lines: Sequence[str], out: Callable[[str], None] = print) -> int:
    """Settings that do not load: one FAIL line per bad variable (the other checks need them)."""
    for line in lines:
        out(render("settings", fail(line.removeprefix("invalid setting "), SETTINGS_FIX)))
    return 1


async def run_doctor(
    settings: Settings, out: Callable[[str], None] = print, runtime: ContainerRuntime | None = None
) -> int:
    results: list[tuple[str, CheckResult]] = [
        ("settings", CheckResult("ok", f"provider {settings.llm_provider.value}, data in {settings.data_dir}"))
    ]
    results.append(await _guard("database", lambda: check_database(settings)))
    results.append(await _guard("telegram", lambda: check_telegram(settings)))
    if results[-1][1].status == "FAIL":
        results.append(("webhook", CheckResult("skip", "not checked: the Telegram check failed")))
    else:
        results.append(await _guard("webhook", lambda: check_webhook(settings)))
    results.append(await _guard("llm", lambda: check_llm(settings)))
    results.append(await _guard("vision", lambda: check_vision(settings)))
    results.append(await _guard("speech", lambda: check_stt(settings)))
    if settings.subagent_runtime is RuntimeKind.KUBERNETES:
        from crewbot.doctor_kube import check_kubernetes

        def probe(owned: ContainerRuntime, runtime_class: str | None) -> Awaitable[CheckResult]:
            return _container_check(settings, owned, runtime_class)

        def probe_spec(code: str, runtime_class: str | None) -> ContainerSpec:
            return _probe_spec(settings, code, runtime_class)

        results.extend(await check_kubernetes(settings, runtime, probe, probe_spec))
    else:
        results.extend(await _docker_checks(settings, runtime))
    from crewbot.doctor_mcp import check_mcp
    from crewbot.doctor_pool import check_pool

    results.append(("pool", check_pool(settings)))
    results.extend(await check_mcp(settings))
    # Library errors quote what they were given (a rejected token, say): never print a secret.
    redactor = SecretRedactor(secrets_of(settings))
    for name, result in results:
        out(redactor.scrub(render(name, result)))
    return 1 if any(result.status == "FAIL" for _, result in results) else 0
