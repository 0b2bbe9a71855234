"""The optional extras: an install without `kubernetes` or without `plot` (Pillow) runs everything else, and a
setting or flag that needs the missing one says so in one line naming the extra. The real command in a
subprocess, with the package made unimportable there (`sys.modules[name] = None`, as if not installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.crewbot.cli_env import COMMAND_WAIT_SECONDS, SECRET_TOKEN, crewbot_env
from tests.crewbot.test_lean_start import START_PATH

UNREACHABLE = "http://127.0.0.1:9/bot"  # the discard port: nothing listens there
KUBE_LINE = "SUBAGENT_RUNTIME=kubernetes needs the kubernetes extra: pip install 'crewbot[kubernetes]'"
PLOT_LINE = "crewbot: --plot needs the plot extra (Pillow): pip install 'crewbot[plot]'"


def crewbot_without(package: str, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`crewbot ARGS` in a process where `package` cannot be imported."""
    program = f"import sys\nsys.modules[{package!r}] = None\nfrom crewbot.cli import run\nsys.exit(run({args!r}))\n"
    return subprocess.run(
        [sys.executable, "-c", program],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_WAIT_SECONDS,
        check=False,
    )


def test_the_docker_start_path_never_imports_kubernetes(tmp_path: Path) -> None:
    probe = (
        "import importlib, sys\n"
        f"for name in {START_PATH!r}: importlib.import_module(name)\n"
        "from core.settings import load_settings\n"
        "from crewbot.serve import subagent_runtime\n"
        "from crewbot.startup import explain\n"
        "settings = load_settings()\n"
        "runtime = subagent_runtime(settings)\n"
        "explain(RuntimeError('a failed start'), settings)\n"
        "print(type(runtime).__name__, sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=crewbot_env(tmp_path / "data"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=COMMAND_WAIT_SECONDS,
        check=True,
    )

    assert done.stdout.strip() == "DockerRuntime []", done.stdout[-2000:] + done.stderr[-2000:]


def test_kubernetes_without_the_extra_stops_start_up_in_one_line(tmp_path: Path) -> None:
    env = crewbot_env(
        tmp_path / "data",
        TELEGRAM_BOT_TOKEN=SECRET_TOKEN,
        TELEGRAM_API_BASE_URL=UNREACHABLE,
        SUBAGENT_RUNTIME="kubernetes",
    )

    done = crewbot_without("kubernetes", ["run"], env, tmp_path)

    assert done.returncode == 2, done.stdout + done.stderr
    assert (done.stdout + done.stderr).strip().splitlines() == [f"crewbot: cannot start: {KUBE_LINE}"]


def test_doctor_names_the_kubernetes_extra(tmp_path: Path) -> None:
    env = crewbot_env(tmp_path / "data", SUBAGENT_RUNTIME="kubernetes")

    done = crewbot_without("kubernetes", ["doctor"], env, tmp_path)

    assert done.returncode == 1, done.stdout + done.stderr
    kube = [line.split(maxsplit=2) for line in done.stdout.splitlines() if line.split()[1:2] == ["kube"]]
    assert kube == [["FAIL", "kube", KUBE_LINE.replace(": pip", "; fix: pip")]], done.stdout


def test_stats_plot_without_pillow_names_the_plot_extra(tmp_path: Path) -> None:
    env = crewbot_env(tmp_path / "data")
    migrated = crewbot_without("PIL", ["migrate"], env, tmp_path)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr

    done = crewbot_without("PIL", ["stats", "--plot", str(tmp_path / "runs.png")], env, tmp_path)

    assert done.returncode == 2, done.stdout + done.stderr
    assert (done.stdout + done.stderr).strip().splitlines() == [PLOT_LINE]
    assert not (tmp_path / "runs.png").exists()
