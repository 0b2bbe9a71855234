"""The base image under the subagent image: Python's official slim image, or a Debian one made here.

Where no registry answers, `debootstrap` builds a minimal Debian bookworm with python3 once and
`docker import` turns it into `crewbot-base:bookworm`, which later builds reuse.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors

DEFAULT_BASE_IMAGE = "python:3.11-slim-bookworm"
FALLBACK_BASE_IMAGE = "crewbot-base:bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_PACKAGES = ("python3", "python3-venv", "ca-certificates")
DEBOOTSTRAP_TIMEOUT_SECONDS = 1_800
APT_TIMEOUT_SECONDS = 600
ERROR_TAIL_LINES = 20
# Image settings an imported root filesystem lacks (docker import takes Dockerfile instructions).
IMPORT_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["/bin/bash"]',
)
# debootstrap prints a line per package and step; these prefixes are the per-package ones.
QUIET_DEBOOTSTRAP_PREFIXES = ("I: Retrieving", "I: Validating", "I: Extracting", "I: Unpacking", "I: Configuring")
# Left behind by debootstrap, useless in an image.
ROOTFS_CACHE_GLOBS = ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_Packages", "var/log/*.log")


class BaseImageError(Exception):
    """No base image could be found, pulled or made; the message says why and what to do."""


def ensure_base_image(client: Any, log: Callable[[str], None], *, requested: str | None = None) -> str:
    """Name of a local base image: `requested` (pulled if missing), else the default or our fallback."""
    if requested is not None:
        if not _present(client, requested):
            _pull(client, requested, log)
        return requested
    for candidate in (DEFAULT_BASE_IMAGE, FALLBACK_BASE_IMAGE):
        if _present(client, candidate):
            log(f"base image: {candidate} (local)")
            return candidate
    try:
        _pull(client, DEFAULT_BASE_IMAGE, log)
        return DEFAULT_BASE_IMAGE
    except BaseImageError as exc:
        log(f"base image: {exc}; making {FALLBACK_BASE_IMAGE} with debootstrap instead")
    build_debootstrap_base(client, FALLBACK_BASE_IMAGE, log)
    return FALLBACK_BASE_IMAGE


def build_debootstrap_base(client: Any, image: str, log: Callable[[str], None]) -> None:
    """Make `image` from a minimal Debian bookworm with python3, venv and CA certificates (needs root)."""
    if os.geteuid() != 0:
        raise BaseImageError(
            f"{DEFAULT_BASE_IMAGE} cannot be pulled and making {image} with debootstrap needs root: "
            f"run `python -m runner.runtimes.image` as root once, or load {DEFAULT_BASE_IMAGE} into Docker"
        )
    debootstrap = _ensure_debootstrap(log)
    repository, _, tag = image.partition(":")
    with tempfile.TemporaryDirectory(prefix="crewbot-rootfs-", dir="/var/tmp") as scratch:
        rootfs = Path(scratch) / "rootfs"
        log(f"base image: debootstrap {DEBIAN_SUITE} into {rootfs} (takes a minute or so)")
        _run_logged(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(DEBOOTSTRAP_PACKAGES)}",
                DEBIAN_SUITE,
                str(rootfs),
                DEBIAN_MIRROR,
            ],
            log,
            timeout_seconds=DEBOOTSTRAP_TIMEOUT_SECONDS,
            what="debootstrap",
        )
        for pattern in ROOTFS_CACHE_GLOBS:
            for leftover in rootfs.glob(pattern):
                leftover.unlink()
        log(f"base image: importing {rootfs} as {image}")
        _import_rootfs(client, rootfs, repository, tag or "latest")
    log(f"base image: {image} ready")


def _present(client: Any, image: str) -> bool:
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


def _pull(client: Any, image: str, log: Callable[[str], None]) -> None:
    repository, _, tag = image.partition(":")
    log(f"base image: pulling {image}")
    try:
        for event in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
            if "error" in event:
                raise BaseImageError(f"cannot pull {image}: {event['error']}")
    except docker.errors.DockerException as exc:
        raise BaseImageError(f"cannot pull {image}: {_short(exc)}") from exc


def _ensure_debootstrap(log: Callable[[str], None]) -> str:
    found = shutil.which("debootstrap")
    if found is not None:
        return found
    log("base image: installing Debian's debootstrap")
    environ = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "debootstrap"]):
        try:
            subprocess.run(command, env=environ, check=True, capture_output=True, timeout=APT_TIMEOUT_SECONDS)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BaseImageError(f"cannot install debootstrap ({' '.join(command)}): {exc}") from exc
    found = shutil.which("debootstrap")
    if found is None:
        raise BaseImageError("debootstrap was installed but is not on PATH")
    return found


def _run_logged(command: list[str], log: Callable[[str], None], *, timeout_seconds: float, what: str) -> None:
    tail: list[str] = []
    try:
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        ) as process:
            assert process.stdout is not None
            # A hung download prints nothing, so the time limit cannot wait for the next line.
            watchdog = threading.Timer(timeout_seconds, process.kill)
            watchdog.start()
            try:
                for raw_line in process.stdout:
                    line = raw_line.rstrip()
                    tail = [*tail[-ERROR_TAIL_LINES + 1 :], line]
                    if line and not line.startswith(QUIET_DEBOOTSTRAP_PREFIXES):
                        log(f"  {what}: {line}")
                exit_code = process.wait()
            finally:
                watchdog.cancel()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BaseImageError(f"{what} could not run: {exc}") from exc
    if exit_code != 0:
        joined = "\n".join(tail)
        if exit_code < 0:
            raise BaseImageError(f"{what} was killed after {timeout_seconds:g} s; last lines:\n{joined}")
        raise BaseImageError(f"{what} failed (exit {exit_code}); last lines:\n{joined}")


def _import_rootfs(client: Any, rootfs: Path, repository: str, tag: str) -> None:
    # tar keeps owners, modes and device nodes as they are; its output streams into the engine.
    with subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as tar:
        assert tar.stdout is not None and tar.stderr is not None
        try:
            client.api.import_image(
                src=tar.stdout, repository=repository, tag=tag, changes=list(IMPORT_CHANGES), stream_src=True
            )
        except docker.errors.DockerException as exc:
            tar.kill()
            raise BaseImageError(f"docker import failed: {_short(exc)}") from exc
        errors = tar.stderr.read().decode(errors="replace").strip()
        if tar.wait() != 0:
            raise BaseImageError(f"tar of the root filesystem failed: {errors}")


def _short(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()
