"""The tools image: the base with SUBAGENT_IMAGE_PACKAGES and SUBAGENT_IMAGE_APT installed, offline.

A container of the base (network none) describes itself (its Python, glibc, Debian release and installed
packages); the host fetches what fits it (image_fetch); the container installs the fetched files from a
read-only mount, with apt-get (local .deb files) and with pip run from its own wheel into /opt/venv; the
container is then committed as `<image>-tools:<key>`, which the Dockerfile builds on instead of the base.

Why a committed container and not a Dockerfile step: the engine's API builds with the classic builder,
which has no `RUN --mount`, so a COPY of the wheels and .deb files would stay in a layer of the image for
good (about 60 MB for a data-analysis set). The mount leaves nothing of the download in the image, and the
Dockerfile, its layers and its cache are the same with tools as without.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import docker.errors
from docker.types import Mount

from runner.runtimes.image_fetch import BaseFacts, Fetched, fetch_tools
from runner.runtimes.image_tools import (
    APT_SETTING,
    LABEL_TOOLS_KEY,
    PIP_SETTING,
    ImageTools,
    ToolsError,
    describe_tools,
    tool_labels,
)

# Under /tmp: the empty mount point the commit keeps is hidden by the tmpfs runs mount there.
MOUNT_POINT = "/tmp/crewbot-tools"
VENV = "/opt/venv"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # for a base that sets no PATH
CACHE_KEY_CHARS = 16
WAIT_SECONDS = "14400"  # the install container's life: fetches and installs take minutes, not hours
# Run in the base by its own python3: what pip and apt need to know to fetch for it.
PROBE = r"""
import json, os, platform, subprocess, sys
facts = {"python": list(sys.version_info[:2]), "implementation": sys.implementation.name,
         "machine": platform.machine(), "glibc": "", "codename": "", "dpkg_arch": "", "dpkg_status": ""}
try:
    facts["glibc"] = os.confstr("CS_GNU_LIBC_VERSION") or ""
except (ValueError, OSError):
    pass
try:
    with open("/etc/os-release", encoding="utf-8") as release:
        for line in release:
            key, _, value = line.strip().partition("=")
            if key == "VERSION_CODENAME":
                facts["codename"] = value.strip('"')
    facts["dpkg_arch"] = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as status:
        facts["dpkg_status"] = status.read()
except OSError:
    pass
print(json.dumps(facts))
"""
# Run by the venv's python after the install: every distribution in it, name (PEP 503 form) to version.
VERSIONS = r"""
import importlib.metadata, json, re
print(json.dumps({re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version
                  for d in importlib.metadata.distributions()}))
"""
# apt-get leaves its package caches behind after installing local files; the image does not need them.
APT_LEFTOVERS = ("/var/cache/apt/pkgcache.bin", "/var/cache/apt/srcpkgcache.bin", "/var/lib/apt/lists/auxfiles")


def tools_image_name(image: str, key: str) -> str:
    """`crewbot-agent:latest` and a key give `crewbot-agent-tools:<first 16 hex digits of the key>`."""
    return f"{tools_repository(image)}:{key[:CACHE_KEY_CHARS]}"


def tools_repository(image: str) -> str:
    repository, colon, tag = image.rpartition(":")
    return f"{repository if colon and '/' not in tag else image}-tools"


def apt_install_command(debs: Sequence[str]) -> list[str]:
    """apt-get orders the local .deb files itself (pre-dependencies included); no index, no network."""
    files = [f"{MOUNT_POINT}/{name}" for name in debs]
    head = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", "--no-install-recommends"]
    return [*head, "-o", "Dpkg::Use-Pty=0", "--", *files]


def venv_first_env(env: Sequence[str] | None) -> list[str]:
    """The base's environment with the venv's bin folder first on PATH: the subagent's `python3` and `python`
    are then the venv's, which holds SUBAGENT_IMAGE_PACKAGES (the base's own python3 does not)."""
    entries = [entry for entry in env or () if not entry.startswith("PATH=")]
    path = next((entry.removeprefix("PATH=") for entry in env or () if entry.startswith("PATH=")), DEFAULT_PATH)
    rest = [folder for folder in path.split(":") if folder and folder != f"{VENV}/bin"]
    return [f"PATH={':'.join([f'{VENV}/bin', *rest])}", *entries]


def pip_install_command(pip_wheel: str, requirements: Sequence[str]) -> list[str]:
    """pip from its wheel, by the venv's python (so into the venv), from the fetched wheels only."""
    pip = [f"{VENV}/bin/python", f"{MOUNT_POINT}/{pip_wheel}/pip", "install", "--disable-pip-version-check"]
    options = ["--no-input", "--no-index", "--find-links", f"{MOUNT_POINT}/wheels", "--no-cache-dir"]
    return [*pip, *options, "--root-user-action=ignore", "--progress-bar", "off", "--", *requirements]


def ensure_tools_image(
    client: Any,
    base: str,
    image: str,
    tools: ImageTools,
    *,
    cache_root: Path,
    force: bool,
    log: Callable[[str], None],
) -> str:
    """The name of a tools image for `tools` on `base` (made unless one exists; `force` remakes it)."""
    found = client.images.get(base)
    key = tools.key(str(found.id))
    name = tools_image_name(image, key)
    labels = _labels(client, name)
    if not force and labels is not None and labels.get(LABEL_TOOLS_KEY) == key:
        log(f"image: tools image {name} is ready ({describe_tools(labels)})")
        return name
    cache = cache_root / key[:CACHE_KEY_CHARS]
    if force:
        shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    log(f"image: making {name} with {tools.summary()}")
    config = found.attrs.get("Config") or {}
    with _install_container(client, base, config, cache) as container:
        facts = BaseFacts.from_report(_exec(container, ["python3", "-c", PROBE], "describe the base image"))
        fetched = fetch_tools(facts, tools, cache, log)
        started = time.monotonic()
        pip_versions, apt_versions = _install(container, tools, fetched)
        labels = tool_labels(key, pip_versions, apt_versions)
        repository, _, tag = name.rpartition(":")
        # The image keeps the base's command and entrypoint, not the container's `sleep`.
        conf = {"Labels": labels, "Cmd": config.get("Cmd") or ["/bin/sh"], "Entrypoint": config.get("Entrypoint")}
        if tools.pip:
            conf["Env"] = venv_first_env(config.get("Env"))
        try:
            container.commit(repository=repository, tag=tag, conf=conf)
        except docker.errors.DockerException as exc:
            raise ToolsError(f"cannot commit the tools image {name}: {_short(exc)}") from exc
    log(f"image: installed in {time.monotonic() - started:.1f} s: {describe_tools(labels)}")
    _prune_cache(cache_root, keep=cache.name)
    return name


def remove_old_tools_images(client: Any, image: str, keep: str | None, log: Callable[[str], None]) -> None:
    """Untag the tools images of `image` other than `keep` (an image still in use stays, said so)."""
    repository = tools_repository(image)
    try:
        found = client.images.list(name=repository)
    except docker.errors.DockerException:
        return
    for old in found:
        for tag in old.tags:
            if tag.startswith(f"{repository}:") and tag != keep:
                try:
                    client.images.remove(tag)
                except docker.errors.APIError as exc:
                    log(f"image: old tools image {tag} kept ({_short(exc)})")
                else:
                    log(f"image: removed the old tools image {tag}")


def _install(container: Any, tools: ImageTools, fetched: Fetched) -> tuple[dict[str, str], dict[str, str]]:
    pip_versions: dict[str, str] = {}
    apt_versions: dict[str, str] = {}
    if fetched.debs:
        _exec(container, apt_install_command(fetched.debs), f"install {APT_SETTING} in the image")
        _exec(container, ["rm", "-rf", "--", *APT_LEFTOVERS], "clean apt's caches")
    if tools.apt:
        query = ["dpkg-query", "-W", "-f=${Package}\t${Version}\n", "--", *tools.apt]
        listed = _exec(container, query, f"list {APT_SETTING} in the image")
        installed = dict(line.split("\t", 1) for line in listed.splitlines() if "\t" in line)
        apt_versions = {name: installed.get(name, "?") for name in tools.apt}
    if tools.pip and fetched.pip_wheel is not None:
        _exec(container, ["python3", "-m", "venv", "--without-pip", VENV], "make the image's venv")
        _exec(container, pip_install_command(fetched.pip_wheel, tools.pip), f"install {PIP_SETTING} in the image")
        listed = _exec(container, [f"{VENV}/bin/python", "-c", VERSIONS], "list the venv's packages")
        try:
            every = dict(json.loads(listed.splitlines()[-1]))
        except (ValueError, TypeError, IndexError):
            raise ToolsError(f"cannot list the venv's packages: {_reason(listed)}") from None
        pip_versions = {name: str(every.get(name, "?")) for name in tools.pip_names()}
    return pip_versions, apt_versions


@contextmanager
def _install_container(client: Any, base: str, config: dict[str, Any], cache: Path) -> Iterator[Any]:
    """A container of the base that waits, with no network and the fetched files mounted read-only (a
    mount, not a volume: a volume would be committed into the image's config)."""
    # A base with an entrypoint of its own gets `sleep` in its place; the commit puts its own back.
    entrypoint = {"entrypoint": ["sleep"]} if config.get("Entrypoint") else {}
    try:
        container = client.containers.run(
            base,
            [WAIT_SECONDS] if entrypoint else ["sleep", WAIT_SECONDS],
            name=f"crewbot-image-tools-{secrets.token_hex(4)}",
            detach=True,
            network_mode="none",
            auto_remove=True,  # gone by itself even if this process dies before removing it
            mounts=[Mount(target=MOUNT_POINT, source=str(cache.resolve()), type="bind", read_only=True)],
            **entrypoint,
        )
    except docker.errors.DockerException as exc:
        raise ToolsError(f"cannot start a container of {base} to install the tools: {_short(exc)}") from exc
    try:
        yield container
    finally:
        with suppress(docker.errors.DockerException):
            container.remove(force=True)


def _exec(container: Any, command: list[str], what: str) -> str:
    try:
        code, output = container.exec_run(command, user="root")
    except docker.errors.DockerException as exc:
        raise ToolsError(f"cannot {what}: {_short(exc)}") from exc
    text = bytes(output or b"").decode(errors="replace")
    if code != 0:
        raise ToolsError(f"cannot {what} (exit {code}): {_reason(text)}")
    return text


def _reason(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("ERROR:", "E:", "dpkg:"))]
    words = " ".join((errors or lines or ["no output"])[-1].split())
    return words[:300]


def _labels(client: Any, name: str) -> dict[str, str] | None:
    try:
        return dict(client.images.get(name).labels or {})
    except docker.errors.ImageNotFound:
        return None


def _prune_cache(cache_root: Path, keep: str) -> None:
    """Only the current tools' download stays: other lists' downloads would only fill the disk."""
    for folder in cache_root.iterdir():
        if folder.is_dir() and folder.name != keep and len(folder.name) == CACHE_KEY_CHARS:
            shutil.rmtree(folder, ignore_errors=True)


def _short(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    return " ".join(str(explanation or exc).split())[:300]
