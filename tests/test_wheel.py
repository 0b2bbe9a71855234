"""The wheel is the product: built from these sources as deploy/Dockerfile.host builds it (`pip wheel`), it
holds the migrations, the subagent image's Dockerfile and the agent's code; installed into a fresh virtual
environment, `crewbot migrate` reaches the latest schema and `crewbot image build` assembles the same build
context, with the same content hash, as this checkout (and, with an engine, builds and tags the image).

The install takes the wheel with --no-deps; its dependencies come from this test's own environment through a
.pth file (the fresh environment's own site-packages, holding only the wheel, comes first on sys.path)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.settings import without_settings
from runner.runtimes.image import LABEL_BASE_IMAGE, LABEL_CONTENT_HASH, collect_context

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "bot", "runner", "container", "crewbot")  # pyproject.toml's packages.find
BUILD_FILES = ("pyproject.toml", "README.md")
STEP_WAIT_SECONDS = 120.0  # a loaded machine takes seconds to import pydantic-ai; pip's build a few more
SHIPPED_MIGRATIONS = sorted(path.name for path in (ROOT / "core" / "store" / "migrations").glob("*.sql"))
AGENT_SOURCES = sorted(
    path.relative_to(ROOT).as_posix()
    for path in (ROOT / "container").rglob("*")
    if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
)


@dataclass(frozen=True, slots=True)
class Installed:
    wheel: Path
    venv: Path
    site_packages: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def run(args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a step, failing the test with its output when it fails; its stdout."""
    done = subprocess.run(
        args,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=STEP_WAIT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def installed_env(home: Path, **extra: str) -> dict[str, str]:
    """No crewbot setting and no PYTHONPATH of the caller's: the installed package, and nothing else, is found."""
    env = {key: value for key, value in without_settings(os.environ).items() if key != "PYTHONPATH"}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"), LLM_PROVIDER="offline", **extra)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    top = tmp_path_factory.mktemp("wheel")
    # A copy, so the build's scratch folders (build/, *.egg-info) stay out of the checkout others work in.
    source = top / "source"
    for name in BUILD_FILES:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(top)])
    (wheel,) = top.glob("crewbot-*.whl")
    venv = top / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = str(venv / "bin" / "python")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", str(wheel)])
    site_packages = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip())
    # Added after the fresh site-packages; the .pth files in them (this checkout's editable finder) do not run.
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site_packages / "crewbot-test-dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    yield Installed(wheel, venv, site_packages)
    shutil.rmtree(top, ignore_errors=True)


def test_the_wheel_holds_the_migrations_the_dockerfile_and_the_agent_code(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        requires = [line for line in wheel.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]

    assert len(SHIPPED_MIGRATIONS) >= 13
    assert [name for name in SHIPPED_MIGRATIONS if f"core/store/migrations/{name}" not in names] == []
    assert "runner/runtimes/subagent.Dockerfile" in names
    assert [name for name in AGENT_SOURCES if name not in names] == []
    # The Kubernetes client only with its extra; Pillow always (the images the main agent is shown), bounded.
    assert [line for line in requires if re.search(r"\bkubernetes\b", line, re.I) and "extra ==" not in line] == []
    assert any(re.match(r"Requires-Dist: pillow<\d+,>=\d+$", line, re.I) for line in requires), requires
    assert any(line.startswith("Requires-Dist: kubernetes") and 'extra == "kubernetes"' in line for line in requires)


def test_the_installed_package_is_the_wheel_not_this_checkout(installed: Installed, tmp_path: Path) -> None:
    probe = "import core.store.db, container, crewbot.cli; print(core.store.db.__file__, container.__file__)"
    printed = run([installed.bin("python"), "-c", probe], env=installed_env(tmp_path), cwd=tmp_path).split()

    assert printed and all(Path(path).is_relative_to(installed.site_packages) for path in printed)


def test_crewbot_migrate_from_a_wheel_install_reaches_the_latest_schema(installed: Installed, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"

    printed = run(
        [installed.bin("crewbot"), "migrate"], env=installed_env(tmp_path, DATA_DIR=str(data_dir)), cwd=tmp_path
    )

    latest = len(SHIPPED_MIGRATIONS)
    assert printed.strip() == f"database {data_dir / 'crewbot.sqlite3'} is at schema version {latest}"
    with sqlite3.connect(data_dir / "crewbot.sqlite3") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == latest


def test_the_image_context_from_a_wheel_install_is_this_checkouts(installed: Installed, tmp_path: Path) -> None:
    probe = (
        "from runner.runtimes.image import DOCKERFILE_SOURCE, collect_context, work_dir\n"
        "context = collect_context('crewbot-base:bookworm')\n"
        "print(context.content_hash, DOCKERFILE_SOURCE, work_dir())\n"
        "print(*sorted(context.files))\n"
    )
    printed = run([installed.bin("python"), "-c", probe], env=installed_env(tmp_path), cwd=tmp_path).splitlines()
    content_hash, dockerfile, work_dir = printed[0].split()

    here = collect_context("crewbot-base:bookworm")
    assert printed[1].split() == sorted(here.files)
    assert content_hash == here.content_hash  # an image built from either is current for both
    assert Path(dockerfile) == installed.site_packages / "runner" / "runtimes" / "subagent.Dockerfile"
    assert Path(work_dir) == tmp_path / "cache" / "crewbot" / "image"  # never inside site-packages


@pytest.mark.docker
def test_crewbot_image_build_from_a_wheel_install(installed: Installed, tmp_path: Path, docker_engine: None) -> None:
    import docker

    image = f"crewbot-wheel-test:{secrets.token_hex(4)}"
    command = [installed.bin("crewbot"), "image", "build", "--image", image]
    env = installed_env(tmp_path, DATA_DIR=str(tmp_path / "data"))
    client = docker.from_env(timeout=STEP_WAIT_SECONDS)
    try:
        built = run(command, env=env, cwd=tmp_path)
        again = run(command, env=env, cwd=tmp_path)
        labels = client.images.get(image).labels
    finally:
        if any(image in tags for tags in (found.tags for found in client.images.list(name="crewbot-wheel-test"))):
            client.images.remove(image)
        client.close()

    assert f"image: {image} built after" in built, built
    assert f"image: {image} is up to date" in again, again
    assert labels[LABEL_CONTENT_HASH] == collect_context(labels[LABEL_BASE_IMAGE]).content_hash
