"""`make host-image`: the bot's own image, crewbot-host:latest (deploy/Dockerfile.host), on the subagent image's
base as runner/runtimes/image_base.py picks it (python:3.11-slim-bookworm where a registry answers, else
crewbot-base:bookworm, made with debootstrap once).

Every wheel crewbot needs, the kubernetes extra included, is built on this host into ROOT/deploy/wheels first,
so the image build itself needs no package index and runs without a network. Prints the build's time and size.

    python scripts/host_image.py [--tag crewbot-host:latest] [--root DIR] [--base-image IMAGE]
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import docker.errors

from runner.runtimes.image import ImageBuildError, follow_build, short_error
from runner.runtimes.image_base import BaseImageError, ensure_base_image

DEFAULT_TAG = "crewbot-host:latest"
ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = "deploy/Dockerfile.host"
WHEELS_DIR = "deploy/wheels"
EXTRAS = "kubernetes"  # the same image runs the bot in a cluster (deploy/kubernetes/bot.yaml)
LABEL_BASE_IMAGE = "crewbot.host.base"
LABEL_INSTALL_STAGE = "crewbot.host.install-stage"  # Dockerfile.host's first stage, one value per build
# A build step can be silent for minutes on a busy machine (pip installing ~60 wheels); the connection waits.
DOCKER_API_TIMEOUT_SECONDS = 1_800
WHEELS_TIMEOUT_SECONDS = 900
# The base's python3 (bookworm's and the official image's): compiled wheels built by another Python do not fit.
BASE_PYTHON = (3, 11)
# What crewbot's own wheel is built from (pyproject.toml's packages.find), copied: setuptools reuses the checkout's
# build/lib and never removes from it, so a module deleted since the last build would ship again.
PACKAGES = ("core", "bot", "runner", "container", "crewbot")
BUILD_FILES = ("pyproject.toml", "README.md")


class HostImageError(Exception):
    """The image could not be built; the message says which step failed and why."""


def check_python() -> None:
    """Before any engine work (the base may take minutes to make): wheels built by another Python do not fit."""
    if sys.version_info[:2] != BASE_PYTHON:
        wanted = ".".join(map(str, BASE_PYTHON))
        raise HostImageError(
            f"this is Python {sys.version.split()[0]}, the image's is {wanted}: their compiled wheels differ; run "
            f"scripts/host_image.py with a Python {wanted} (e.g. `python{wanted} -m venv /tmp/hostimage-venv` and "
            "`pip install -e .` into it)"
        )


def copy_sources(root: Path, dest: Path) -> Path:
    """Only what the wheel is built from, without bytecode or build scratch."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in BUILD_FILES:
        shutil.copy2(root / name, dest / name)
    for package in PACKAGES:
        shutil.copytree(root / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def build_wheels(root: Path, log: Callable[[str], None]) -> Path:
    """crewbot and its dependencies as wheels in ROOT/deploy/wheels (emptied first: no stale versions)."""
    wheels = root / WHEELS_DIR
    shutil.rmtree(wheels, ignore_errors=True)
    log(f"host image: building wheels into {wheels}")
    with tempfile.TemporaryDirectory(prefix="crewbot-host-wheel-") as scratch:
        source = copy_sources(root, Path(scratch) / "crewbot")
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), f".[{EXTRAS}]"]
        try:
            done = subprocess.run(
                command, cwd=source, capture_output=True, text=True, timeout=WHEELS_TIMEOUT_SECONDS, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise HostImageError(f"pip wheel could not run: {exc}") from exc
    if done.returncode != 0:
        raise HostImageError(f"pip wheel failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return wheels


def build_image(root: Path, tag: str, base: str, log: Callable[[str], None]) -> None:
    """`docker build` of deploy/Dockerfile.host with BASE_IMAGE=base, no network (the wheels are in the context);
    the install stage's image, which the classic builder leaves untagged (300 MB), is removed after."""
    stage = secrets.token_hex(8)
    client = docker.from_env(timeout=DOCKER_API_TIMEOUT_SECONDS)
    try:
        events = client.api.build(
            path=str(root),
            dockerfile=DOCKERFILE,
            tag=tag,
            buildargs={"BASE_IMAGE": base, "STAGE_LABEL": stage},
            labels={LABEL_BASE_IMAGE: base},
            network_mode="none",
            pull=False,
            rm=True,
            forcerm=True,
            decode=True,
        )
        follow_build(events, tag, log)
    except ImageBuildError as exc:
        raise HostImageError(str(exc)) from exc
    except docker.errors.DockerException as exc:
        raise HostImageError(f"docker build of {tag} failed: {short_error(exc)}") from exc
    finally:
        for image in client.images.list(filters={"label": f"{LABEL_INSTALL_STAGE}={stage}"}):
            with contextlib.suppress(docker.errors.APIError):  # BuildKit keeps no stage images: none is found
                client.images.remove(image.id)
        client.close()


def image_id(tag: str) -> str | None:
    client = docker.from_env()
    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        return None
    finally:
        client.close()


def image_size_bytes(tag: str) -> int:
    client = docker.from_env()
    try:
        return int(client.images.get(tag).attrs.get("Size") or 0)
    finally:
        client.close()


def remove_previous(previous_id: str | None, tag: str, log: Callable[[str], None]) -> None:
    """The image the tag named before, left untagged by the new build (420 MB each); one in use stays."""
    if previous_id is None or previous_id == image_id(tag):
        return
    client = docker.from_env()
    try:
        client.images.remove(previous_id)
        log(f"host image: removed the previous image {previous_id[:19]}")
    except docker.errors.APIError as exc:
        log(f"host image: previous image {previous_id[:19]} kept ({short_error(exc)})")
    finally:
        client.close()


def base_image(requested: str | None, log: Callable[[str], None]) -> str:
    try:
        client: Any = docker.from_env(timeout=DOCKER_API_TIMEOUT_SECONDS)
    except docker.errors.DockerException as exc:
        raise HostImageError(f"Docker engine not reachable ({short_error(exc)}); start it: `make engine`") from exc
    try:
        return ensure_base_image(client, log, requested=requested)
    except BaseImageError as exc:
        raise HostImageError(str(exc)) from exc
    except docker.errors.DockerException as exc:
        raise HostImageError(f"Docker engine not reachable ({short_error(exc)}); start it: `make engine`") from exc
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/host_image.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image name (default {DEFAULT_TAG})")
    parser.add_argument("--root", type=Path, default=ROOT, help="the sources to build from (default: this checkout)")
    parser.add_argument("--base-image", default=None, help="base image (default: the subagent image's)")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, flush=True)

    started = time.monotonic()
    try:
        check_python()
        base = base_image(args.base_image, log)
        build_wheels(args.root.resolve(), log)
        wheels_done = time.monotonic()
        log(f"host image: wheels built after {wheels_done - started:.1f} s; building {args.tag} on {base}")
        previous_id = image_id(args.tag)
        build_image(args.root.resolve(), args.tag, base, log)
        remove_previous(previous_id, args.tag, log)
        size = image_size_bytes(args.tag)
    except HostImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (docker.errors.DockerException, OSError) as exc:  # requests' errors are OSErrors
        print(f"error: the Docker engine failed ({short_error(exc)}); is it running? `make engine`", file=sys.stderr)
        return 1
    finished = time.monotonic()
    log(
        f"host image: {args.tag} on {base} built after {finished - started:.1f} s "
        f"(wheels {wheels_done - started:.1f} s, image {finished - wheels_done:.1f} s; {size / 1_000_000:.0f} MB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
