"""The subagent image's Python packages as a wheelhouse, made on the host with pip.

`docker build` has no network here (and no pip configuration), so the packages are downloaded on the
host for the image's interpreter (CPython 3.11, glibc 2.36, x86_64) and installed in the build with
`--no-index`. Versions are the host's: the container runs the library versions the host is tested with.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

# Top-level packages of `container/`; everything they pull in is pinned to the host's versions too.
IMAGE_REQUIREMENTS = ("pydantic-ai-slim[openai,anthropic]", "pydantic")
INSTALLER_REQUIREMENT = "pip"  # installs the others in the build, then stays out of the image
TARGET_PYTHON_VERSION = "3.11"
TARGET_ABI = "cp311"
TARGET_IMPLEMENTATION = "cp"
TARGET_ARCH = "x86_64"
TARGET_GLIBC_MINOR = 36  # Debian bookworm; pip does not widen a manylinux tag to older ones by itself
OLDEST_GLIBC_MINOR = 5
REQUIREMENTS_FILE = "requirements.txt"
STAMP_FILE = ".complete"
OWN_DISTRIBUTION = "crewbot"
PIP_TIMEOUT_SECONDS = 900
ERROR_TAIL_LINES = 20


class WheelhouseError(Exception):
    """The wheelhouse could not be made; the message says which step failed and why."""


@dataclass(frozen=True, slots=True)
class Wheelhouse:
    path: Path
    wheels: tuple[str, ...]  # file names, sorted: they carry name, version and platform


def ensure_wheelhouse(directory: Path, log: Callable[[str], None]) -> Wheelhouse:
    """Wheels for the image in `directory`, downloaded only when the requirements changed."""
    requirements = pinned_requirements()
    if wheelhouse_is_current(directory):
        wheelhouse = _read(directory)
        log(f"wheelhouse: {len(wheelhouse.wheels)} wheels cached in {directory}")
        return wheelhouse
    log(f"wheelhouse: downloading {', '.join(requirements)} for CPython {TARGET_PYTHON_VERSION}")
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    _download(partial, [*requirements, _pinned(INSTALLER_REQUIREMENT)], host_constraints())
    (partial / REQUIREMENTS_FILE).write_text("".join(f"{line}\n" for line in requirements))
    (partial / STAMP_FILE).write_text(wheelhouse_stamp())  # last: a stamp means the download finished
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)
    wheelhouse = _read(directory)
    log(f"wheelhouse: {len(wheelhouse.wheels)} wheels in {directory}")
    return wheelhouse


def pinned_requirements() -> list[str]:
    """`IMAGE_REQUIREMENTS`, each pinned to the version installed on the host."""
    return [_pinned(requirement) for requirement in IMAGE_REQUIREMENTS]


def host_constraints() -> list[str]:
    """`name==version` for every distribution on the host but crewbot itself, sorted."""
    pins = {
        dist.metadata["Name"].lower(): f"{dist.metadata['Name']}=={dist.version}"
        for dist in distributions()
        if dist.metadata["Name"] and dist.metadata["Name"].lower() != OWN_DISTRIBUTION
    }
    return sorted(pins.values(), key=str.lower)


def target_platforms() -> list[str]:
    """manylinux tags the image's glibc accepts, newest first."""
    return [f"manylinux_2_{minor}_{TARGET_ARCH}" for minor in range(TARGET_GLIBC_MINOR, OLDEST_GLIBC_MINOR - 1, -1)]


def wheelhouse_stamp() -> str:
    """What a finished download for today's requirements and target writes to its stamp file."""
    spec = {
        "requirements": pinned_requirements(),
        "installer": _pinned(INSTALLER_REQUIREMENT),
        "python": TARGET_PYTHON_VERSION,
        "abi": TARGET_ABI,
        "platforms": target_platforms(),
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def wheelhouse_is_current(directory: Path) -> bool:
    """The download finished for today's requirements, and the host still has each wheel's version.

    Only the wheels' own distributions count: an unrelated package changing on the host does not send
    the build back to the package index.
    """
    stamp = directory / STAMP_FILE
    if not stamp.is_file() or stamp.read_text() != wheelhouse_stamp():
        return False
    wheels = list(directory.glob("*.whl"))
    for wheel in wheels:
        name, wheel_version = wheel.name.split("-")[:2]
        try:
            if version(name) != wheel_version:
                return False
        except PackageNotFoundError:
            return False
    return bool(wheels)


def _pinned(requirement: str) -> str:
    name = requirement.split("[", 1)[0]
    try:
        return f"{requirement}=={version(name)}"
    except PackageNotFoundError as exc:
        raise WheelhouseError(
            f"{name} is not installed on the host; install the project (pip install -e .) first"
        ) from exc


def _download(directory: Path, requirements: list[str], constraints: list[str]) -> None:
    platform_args = [arg for platform in target_platforms() for arg in ("--platform", platform)]
    with tempfile.NamedTemporaryFile("w", prefix="crewbot-constraints-", suffix=".txt") as constraints_file:
        constraints_file.write("".join(f"{line}\n" for line in constraints))
        constraints_file.flush()
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            *platform_args,
            "--python-version",
            TARGET_PYTHON_VERSION,
            "--implementation",
            TARGET_IMPLEMENTATION,
            "--abi",
            TARGET_ABI,
            "--constraint",
            constraints_file.name,
            "--dest",
            str(directory),
            *requirements,
        ]
        try:
            completed = subprocess.run(
                command, capture_output=True, text=True, timeout=PIP_TIMEOUT_SECONDS, check=False
            )
        except FileNotFoundError as exc:
            raise WheelhouseError(f"cannot run {sys.executable}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise WheelhouseError(f"pip download took longer than {PIP_TIMEOUT_SECONDS} s") from exc
    if completed.returncode != 0:
        output = (completed.stdout + completed.stderr).splitlines()
        # This machine's pip configuration names optional local indexes; their warnings are noise.
        relevant = [line for line in output if "is ignored: it is neither a file nor a directory" not in line]
        tail = "\n".join(relevant[-ERROR_TAIL_LINES:])
        raise WheelhouseError(f"pip download failed (exit {completed.returncode}):\n{tail}")


def _read(directory: Path) -> Wheelhouse:
    wheels = tuple(sorted(path.name for path in directory.glob("*.whl")))
    if not wheels:
        raise WheelhouseError(f"{directory} holds no wheels")
    return Wheelhouse(path=directory, wheels=wheels)
