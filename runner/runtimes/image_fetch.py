"""Fetch the image's tools on the host, where the network is: wheels with pip, .deb files with apt.

Containers have no network, the image build included, so everything the image installs is downloaded
here, for the base image's Python and Debian release (not the host's), into a cache folder that a
container of the base then mounts read-only. Every command is an argument list (never a shell string)
and the requirements and package names come after `--`, so none of them can be read as an option.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from container.text import one_line
from runner.runtimes.image_base import DEBIAN_MIRROR
from runner.runtimes.image_tools import APT_SETTING, PIP_SETTING, ImageTools, ToolsError

DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
PIP_TIMEOUT_SECONDS = 1_800
APT_TIMEOUT_SECONDS = 900
MAX_REASON_CHARS = 300
FETCHED_FILE = "fetched.json"
# Oldest glibc minor whose manylinux tag pip may take: PEP 600's 2_5 on x86, manylinux2014's 2_17 elsewhere.
OLDEST_GLIBC_MINOR = {"x86_64": 5, "i686": 5}
DEFAULT_OLDEST_GLIBC_MINOR = 17
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
SAFE_WORD = re.compile(r"[a-z0-9][a-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class BaseFacts:
    """What the base image is, as a container of it reports: its Python, C library and Debian release."""

    python: tuple[int, int]
    implementation: str
    machine: str
    glibc: tuple[int, int] | None
    codename: str
    dpkg_arch: str
    dpkg_status: str

    @classmethod
    def from_report(cls, text: str) -> BaseFacts:
        """From the probe's JSON line (see image_install.PROBE)."""
        try:
            report = json.loads(text.strip().splitlines()[-1])
            major, minor = (int(part) for part in report["python"])
            glibc = re.fullmatch(r"glibc (\d+)\.(\d+)(\.\d+)?", str(report.get("glibc") or ""))
            return cls(
                python=(major, minor),
                implementation=str(report["implementation"]),
                machine=str(report["machine"]),
                glibc=(int(glibc.group(1)), int(glibc.group(2))) if glibc else None,
                codename=str(report.get("codename") or ""),
                dpkg_arch=str(report.get("dpkg_arch") or ""),
                dpkg_status=str(report.get("dpkg_status") or ""),
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ToolsError(f"the base image did not describe itself ({type(exc).__name__}: {exc})") from None

    @property
    def python_text(self) -> str:
        return f"{self.python[0]}.{self.python[1]}"

    def where(self) -> str:
        libc = f"glibc {self.glibc[0]}.{self.glibc[1]}" if self.glibc else "no glibc"
        return f"Python {self.python_text}, {libc}, {self.machine}"


@dataclass(frozen=True, slots=True)
class Fetched:
    """The files fetched for one set of tools, relative to its cache folder."""

    pip_wheel: str | None = None
    wheels: tuple[str, ...] = ()
    debs: tuple[str, ...] = ()


def pip_platforms(facts: BaseFacts) -> list[str]:
    """Every manylinux tag the base's glibc runs, newest first (pip does not widen `--platform` itself)."""
    if facts.glibc is None or facts.glibc[0] != 2:
        raise ToolsError(
            f"{PIP_SETTING} needs a base image with glibc 2 (manylinux wheels); this one has {facts.where()}"
        )
    arch = facts.machine
    oldest = OLDEST_GLIBC_MINOR.get(arch, DEFAULT_OLDEST_GLIBC_MINOR)
    tags: list[str] = []
    for minor in range(facts.glibc[1], oldest - 1, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        legacy = LEGACY_MANYLINUX.get(minor)
        if legacy is not None:
            tags.append(f"{legacy}_{arch}")
    return tags


def pip_download_command(
    facts: BaseFacts, dest: Path, requirements: Sequence[str], *, no_deps: bool = False, python: str = sys.executable
) -> list[str]:
    """`pip download` of wheels only, for the base's interpreter and platforms; dependencies resolved for it."""
    if facts.implementation != "cpython":
        raise ToolsError(f"{PIP_SETTING} needs a CPython base image; this one runs {facts.implementation}")
    version = f"{facts.python[0]}{facts.python[1]}"
    command = [python, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
    command += ["--only-binary=:all:", "--dest", str(dest), "--python-version", facts.python_text]
    command += ["--implementation", "cp", "--abi", f"cp{version}"]
    for tag in pip_platforms(facts):
        command += ["--platform", tag]
    if no_deps:
        command.append("--no-deps")
    return [*command, "--", *requirements]


def apt_options(root: Path, debs: Path, arch: str) -> list[str]:
    """apt's own state, sources and cache under `root`: the host's apt state is never read or touched."""
    settings = {
        "Dir::Etc::SourceList": root / "sources.list",
        "Dir::Etc::SourceParts": root / "parts",
        "Dir::Etc::Preferences": root / "preferences",
        "Dir::Etc::PreferencesParts": root / "parts",
        "Dir::State": root / "state",
        "Dir::State::status": root / "status",
        "Dir::Cache": root / "cache",
        "Dir::Cache::archives": debs,
        "Debug::NoLocking": "true",
        "APT::Architecture": arch,
        "APT::Architectures": arch,
        "Acquire::Languages": "none",
    }
    options: list[str] = []
    for name, value in settings.items():
        options += ["-o", f"{name}={value}"]
    return options


def apt_download_command(options: Sequence[str], packages: Sequence[str]) -> list[str]:
    """What the base lacks for `packages` (apt reads the base's dpkg status), downloaded, never installed."""
    head = ["apt-get", *options, "-q", "-y", "--no-install-recommends", "--no-remove", "--download-only"]
    return [*head, "install", "--", *packages]


def sources_list(codename: str) -> str:
    signed = f"[signed-by={DEBIAN_KEYRING}]"
    return (
        f"deb {signed} {DEBIAN_MIRROR} {codename} main\n"
        f"deb {signed} {DEBIAN_MIRROR} {codename}-updates main\n"
        f"deb {signed} {DEBIAN_SECURITY_MIRROR} {codename}-security main\n"
    )


def fetch_tools(facts: BaseFacts, tools: ImageTools, cache: Path, log: Callable[[str], None]) -> Fetched:
    """The wheels and .deb files for `tools`, fetched into `cache` unless a previous fetch finished there."""
    done = _read_fetched(cache)
    if tools.pip and "pip" not in done:
        done["pip"] = _fetch_pip(facts, tools, cache, log)
        _write_fetched(cache, done)
    if tools.apt and "apt" not in done:
        done["apt"] = _fetch_apt(facts, tools, cache, log)
        _write_fetched(cache, done)
    pip_part, apt_part = done.get("pip", {}), done.get("apt", {})
    return Fetched(
        pip_wheel=str(pip_part["pip"]) if tools.pip else None,
        wheels=tuple(str(name) for name in pip_part.get("wheels", ())),
        debs=tuple(str(name) for name in apt_part.get("debs", ())),
    )


def _fetch_pip(facts: BaseFacts, tools: ImageTools, cache: Path, log: Callable[[str], None]) -> dict[str, Any]:
    wheels, installer = _fresh(cache / "wheels"), _fresh(cache / "pip")
    started = time.monotonic()
    log(f"image: fetching {len(tools.pip)} pip requirement(s) and their dependencies for {facts.where()}")
    what = f"cannot fetch {PIP_SETTING} ({' '.join(tools.pip)}) for {facts.where()}"
    run_fetch(pip_download_command(facts, wheels, tools.pip), what, PIP_TIMEOUT_SECONDS, _pip_reason)
    # The image's venv has no pip: the install runs pip from its wheel (python pip.whl/pip install ...).
    run_fetch(pip_download_command(facts, installer, ["pip"], no_deps=True), what, PIP_TIMEOUT_SECONDS, _pip_reason)
    names = sorted(path.name for path in wheels.glob("*.whl"))
    pip_wheels = sorted(path.name for path in installer.glob("pip-*.whl"))
    if not pip_wheels:
        raise ToolsError(f"{what}: pip download saved no pip wheel")
    log(f"image: fetched {len(names)} wheel(s), {_megabytes(wheels)} in {time.monotonic() - started:.1f} s")
    return {"pip": f"pip/{pip_wheels[-1]}", "wheels": [f"wheels/{name}" for name in names]}


def _fetch_apt(facts: BaseFacts, tools: ImageTools, cache: Path, log: Callable[[str], None]) -> dict[str, Any]:
    what = f"cannot fetch {APT_SETTING} ({' '.join(tools.apt)})"
    if not SAFE_WORD.fullmatch(facts.codename) or not SAFE_WORD.fullmatch(facts.dpkg_arch) or not facts.dpkg_status:
        raise ToolsError(
            f"{what}: the base image is not a Debian release with dpkg ({facts.codename or 'no codename'})"
        )
    if shutil.which("apt-get") is None or not DEBIAN_KEYRING.is_file():
        raise ToolsError(
            f"{what}: the host needs apt-get and {DEBIAN_KEYRING} (a Debian host; Ubuntu: debian-archive-keyring)"
        )
    root, debs = _fresh(cache / "apt"), _fresh(cache / "debs")
    for folder in (root / "parts", root / "state" / "lists" / "partial", root / "cache" / "archives" / "partial"):
        folder.mkdir(parents=True)
    (debs / "partial").mkdir()
    (root / "sources.list").write_text(sources_list(facts.codename))
    (root / "status").write_text(facts.dpkg_status)
    options = apt_options(root, debs, facts.dpkg_arch)
    started = time.monotonic()
    where = f"{facts.codename} {facts.dpkg_arch}"
    log(f"image: fetching {len(tools.apt)} Debian package(s) and what the base lacks of their dependencies ({where})")
    run_fetch(["apt-get", *options, "-q", "update"], what, APT_TIMEOUT_SECONDS, _apt_reason)
    run_fetch(apt_download_command(options, tools.apt), what, APT_TIMEOUT_SECONDS, _apt_reason)
    shutil.rmtree(root, ignore_errors=True)  # the indexes (about 20 MB) served this download only
    names = sorted(path.name for path in debs.glob("*.deb"))
    log(f"image: fetched {len(names)} .deb file(s), {_megabytes(debs)} in {time.monotonic() - started:.1f} s")
    return {"debs": [f"debs/{name}" for name in names]}


def run_fetch(command: list[str], what: str, timeout_seconds: float, reason: Callable[[str], str]) -> str:
    """Run a fetch command; on failure raise ToolsError with `what` and the command's own reason, one line."""
    environ: Mapping[str, str] = {**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run(
            command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            timeout=timeout_seconds, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ToolsError(f"{what}: {command[0]} did not finish within {timeout_seconds:g} s") from None
    except OSError as exc:
        raise ToolsError(f"{what}: {command[0]} could not run ({exc.strerror or exc})") from None
    if done.returncode != 0:
        raise ToolsError(f"{what}: {reason(done.stdout)}")
    return done.stdout


def _pip_reason(output: str) -> str:
    errors = [line.removeprefix("ERROR: ").strip() for line in output.splitlines() if line.startswith("ERROR: ")]
    final = [line for line in errors if line.startswith("No matching distribution found")]
    text = (final or errors or _last_lines(output))[0]
    if final or "from versions: none" in text:
        text += " (only wheels are used, built for the image's Python and platform)"
    return one_line(text, MAX_REASON_CHARS)


def _apt_reason(output: str) -> str:
    errors = [line.removeprefix("E: ").strip() for line in output.splitlines() if line.startswith("E: ")]
    return one_line("; ".join(dict.fromkeys(errors)) if errors else _last_lines(output)[0], MAX_REASON_CHARS)


def _last_lines(output: str) -> list[str]:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return [lines[-1] if lines else "no output"]


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _megabytes(folder: Path) -> str:
    size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    return f"{size / 1_000_000:.1f} MB"


def _read_fetched(cache: Path) -> dict[str, dict[str, Any]]:
    """The parts a previous fetch finished whose files are all still there."""
    try:
        parsed = json.loads((cache / FETCHED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(parsed, dict):
        return {}
    parts: dict[str, dict[str, Any]] = {}
    for name, part in parsed.items():
        files = [part.get("pip"), *part.get("wheels", []), *part.get("debs", [])] if isinstance(part, dict) else [""]
        if all(isinstance(file, str | None) and (file is None or (cache / file).is_file()) for file in files):
            parts[str(name)] = part
    return parts


def _write_fetched(cache: Path, fetched: dict[str, dict[str, Any]]) -> None:
    partial = cache / f"{FETCHED_FILE}.partial"
    partial.write_text(json.dumps(fetched, indent=1))
    partial.replace(cache / FETCHED_FILE)
