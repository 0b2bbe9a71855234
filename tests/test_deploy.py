"""The files under deploy/ agree with the code: the dashboard queries only series the bot exports, the
unit and the host image start `crewbot run` with metrics on, and every file the docs promise exists."""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path

import pytest
from docker.utils.build import exclude_paths
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runner.lifecycle.metrics import RunMetrics

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SERIES_SUFFIXES = ("_bucket", "_count", "_sum", "_total")
# Both images are built with the repository root as the context, so its one .dockerignore serves both.
DOCKERFILES = ("runner/runtimes/subagent.Dockerfile", "deploy/Dockerfile.host")
SECRETS = (".env", "data/crewbot.db")  # an operator's token and chats: never sent to the engine


def exported_series() -> set[str]:
    metrics = RunMetrics()
    metrics.watch(running=lambda: 0, queued=lambda: 0, max_concurrent=lambda: 3, max_per_chat=lambda: 3)
    text = generate_latest(metrics.registry).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_dashboard_queries_only_exported_series() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text(encoding="utf-8"))
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(expressions) >= 10
    used = {name for expr in expressions for name in re.findall(r"\bcrewbot_[a-z_]+", expr)}
    assert used - exported_series() == set()
    # The cap decision at a glance: the cap, running, queued, refusals, queue wait and memory per run.
    for name in (
        "crewbot_subagents_max_concurrent",
        "crewbot_subagents_running",
        "crewbot_subagents_queued",
        "crewbot_subagent_refusals_total",
        "crewbot_subagent_queue_wait_seconds_bucket",
        "crewbot_subagent_memory_peak_bytes_bucket",
    ):
        assert name in used


def test_the_systemd_unit_runs_the_bot_with_metrics_and_a_clean_stop() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "crewbot.service")
    service = unit["Service"]
    assert service["ExecStart"].endswith("crewbot run")
    assert service["KillSignal"] == "SIGTERM"
    assert "METRICS_ADDR=" in service["Environment"] and "DATA_DIR=" in service["Environment"]
    assert "docker" in service["SupplementaryGroups"]


def test_the_host_image_runs_the_bot_with_the_engine_socket_and_a_health_check() -> None:
    text = (DEPLOY / "Dockerfile.host").read_text(encoding="utf-8")
    assert 'ENTRYPOINT ["crewbot"]' in text and 'CMD ["run"]' in text
    assert "/var/run/docker.sock:/var/run/docker.sock" in text
    assert "/healthz" in text and "HEALTHCHECK" in text


def test_the_docs_point_at_every_deploy_file() -> None:
    docs = "".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md")))
    for path in sorted(DEPLOY.iterdir()):
        assert f"deploy/{path.name}" in docs


def copy_sources(dockerfile: Path) -> list[str]:
    """The context paths a Dockerfile's COPY lines read (not `--from` another stage)."""
    sources: list[str] = []
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(word.startswith("--from") for word in words):
            sources += [word.rstrip("/") for word in words[1:-1] if not word.startswith("--")]
    return sources


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_root_build_context_holds_what_each_dockerfile_copies_and_no_secrets(
    tmp_path: Path, dockerfile: str
) -> None:
    sources = copy_sources(ROOT / dockerfile)
    assert sources, f"{dockerfile} copies nothing from the context"
    tree = [f"{source}/file.txt" for source in sources] + list(SECRETS) + list(DOCKERFILES)
    for relative in tree:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x")
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line for line in ignore if line.strip() and not line.startswith("#")]

    sent = set(exclude_paths(str(tmp_path), patterns, dockerfile=dockerfile))

    assert [source for source in sources if f"{source}/file.txt" not in sent] == []
    assert [secret for secret in SECRETS if secret in sent] == []
