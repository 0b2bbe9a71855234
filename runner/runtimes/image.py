"""Build the subagent image `crewbot-agent:latest`: base image, tools if any, then `docker build`.

The agent needs only the standard library (the host makes its model requests), so the image is the base's
Python and `container/`, plus the tools SUBAGENT_IMAGE_PACKAGES and SUBAGENT_IMAGE_APT ask for (none by
default; image_install bakes them into a tools image the Dockerfile then builds on). The build context is
assembled here from package data, the Dockerfile (subagent.Dockerfile beside this module) and the `container`
package's files, read through importlib.resources: a wheel install builds the same image as a source
checkout. What is sent is exactly what is hashed: the image carries that hash (over the tool lists too) as a
label, which tells a current image from a stale one.
Usable as `python -m runner.runtimes.image [--if-missing | --force]` (the Makefile does).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import os
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import IO, Any, Literal

import docker
import docker.errors

from runner.runtimes.image_base import BaseImageError, ensure_base_image
from runner.runtimes.image_install import ensure_tools_image, remove_old_tools_images
from runner.runtimes.image_tools import ImageTools, ToolsError, tools_from_settings

DEFAULT_IMAGE = "crewbot-agent:latest"
LABEL_CONTENT_HASH = "crewbot.image.content_hash"
LABEL_BASE_IMAGE = "crewbot.image.base"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # a source checkout's root; site-packages in a wheel install
DOCKERFILE = "Dockerfile"  # its name in the build context (and in the content hash)
CONTAINER_PACKAGE = "container"
# Package data, so an installed crewbot can build its own subagent image.
DOCKERFILE_SOURCE: Traversable = files("runner.runtimes") / "subagent.Dockerfile"
CONTAINER_SOURCE: Traversable = files(CONTAINER_PACKAGE)
CHECKOUT_WORK_DIR = "build/image"  # a source checkout's lock and downloads (`make clean` removes them)
INSTALL_WORK_DIR = "crewbot/image"  # a wheel install's, under the user's cache folder (XDG_CACHE_HOME)
BUILD_LOCK_FILE = ".lock"
TOOLS_CACHE_DIR = "tools"  # the fetched wheels and .deb files, one folder per tool set
SKIPPED_PARTS = frozenset({"__pycache__"})
SKIPPED_SUFFIXES = frozenset({".pyc", ".pyo"})
# A build step can be silent for minutes on a busy machine; the engine connection must outlast it.
DOCKER_API_TIMEOUT_SECONDS = 1_800
DOCKER_PING_TIMEOUT_SECONDS = 10
CONTEXT_FILE_MODE = 0o644
CONTEXT_DIR_MODE = 0o755
SPOOL_MAX_BYTES = 64 * 1024 * 1024

ImageStatus = Literal["missing", "stale", "current"]


class ImageBuildError(Exception):
    """The image could not be built or inspected; the message says which step failed and why."""


@dataclass(frozen=True, slots=True)
class BuildContext:
    """The files of the build context, relative path to absolute path, and their content hash."""

    files: dict[str, Traversable]
    content_hash: str


def image_exists(image: str = DEFAULT_IMAGE) -> bool:
    """True when the engine has `image` (any version of it)."""
    with _docker_client() as client:
        return _image_labels(client, image) is not None


def image_status(image: str = DEFAULT_IMAGE, tools: ImageTools | None = None) -> ImageStatus:
    """`missing`, `stale` (built from other sources, on another base or with other tools) or `current`.
    `tools` defaults to what the settings (environment and .env) ask for."""
    wanted = _tools(tools)
    with _docker_client() as client:
        labels = _image_labels(client, image)
    return "missing" if labels is None else status_from_labels(labels, wanted)


def status_from_labels(labels: dict[str, str], tools: ImageTools) -> ImageStatus:
    """`current` when the image's content hash is the one these sources, its base and `tools` give."""
    base = labels.get(LABEL_BASE_IMAGE)
    if not base:
        return "stale"
    return "current" if labels.get(LABEL_CONTENT_HASH) == collect_context(base, tools).content_hash else "stale"


def build_image(
    image: str = DEFAULT_IMAGE,
    *,
    force: bool = False,
    log: Callable[[str], None] = print,
    base_image: str | None = None,
    tools: ImageTools | None = None,
    cache_dir: Path | None = None,
) -> None:
    """Build `image` unless it is current; `force` rebuilds every layer and refetches the tools. `tools`
    defaults to the settings' lists; `cache_dir` (default work_dir()/tools) keeps their downloads. Raises
    ImageBuildError; the image is left as it was unless the new one was built."""
    wanted = _tools(tools)
    with _build_lock(log):
        _build_locked(image, force=force, log=log, base_image=base_image, tools=wanted, cache_dir=cache_dir)


def _tools(tools: ImageTools | None) -> ImageTools:
    try:
        return tools_from_settings() if tools is None else tools
    except ToolsError as exc:
        raise ImageBuildError(str(exc)) from exc


def _build_locked(
    image: str,
    *,
    force: bool,
    log: Callable[[str], None],
    base_image: str | None,
    tools: ImageTools,
    cache_dir: Path | None,
) -> None:
    started = time.monotonic()
    with _docker_client() as client:
        try:
            base = ensure_base_image(client, log, requested=base_image)
        except BaseImageError as exc:
            raise ImageBuildError(str(exc)) from exc
        log(f"image: base image {base} ready after {time.monotonic() - started:.1f} s")
        context = collect_context(base, tools)
        labels = _image_labels(client, image)
        if not force and labels is not None and labels.get(LABEL_CONTENT_HASH) == context.content_hash:
            log(f"image: {image} is up to date ({context.content_hash[:12]})")
            return
        build_from = base
        if tools:
            cache = cache_dir or work_dir() / TOOLS_CACHE_DIR
            try:
                build_from = ensure_tools_image(client, base, image, tools, cache_root=cache, force=force, log=log)
            except ToolsError as exc:
                raise ImageBuildError(f"{exc} ({image} left as it was)") from exc
            except docker.errors.DockerException as exc:
                raise ImageBuildError(
                    f"cannot make the tools image: {short_error(exc)} ({image} left as it was)"
                ) from exc
        previous_id = _image_id(client, image)
        log(f"image: building {image} from {build_from} ({len(context.files)} files in the context)")
        _docker_build(client, image, build_from, base, context, nocache=force, log=log)
        if (_image_labels(client, image) or {}).get(LABEL_CONTENT_HASH) != context.content_hash:
            raise ImageBuildError(f"docker build finished but {image} does not carry the new content hash")
        if previous_id is not None and previous_id != _image_id(client, image):
            _remove_if_unused(client, previous_id, log)
        remove_old_tools_images(client, image, build_from if tools else None, log)
        size = int(client.images.get(image).attrs.get("Size") or 0)
    log(f"image: {image} built after {time.monotonic() - started:.1f} s ({size / 1_000_000:.0f} MB)")


def collect_context(base_image: str, tools: ImageTools | None = None) -> BuildContext:
    """The Dockerfile and `container/`, with a hash over their paths, bytes, the base and the tools (none
    adds nothing: the image without tools keeps its hash)."""
    if not DOCKERFILE_SOURCE.is_file() or not CONTAINER_SOURCE.is_dir():
        raise ImageBuildError(
            f"{DOCKERFILE_SOURCE} or {CONTAINER_SOURCE} is missing: reinstall crewbot (its package data is incomplete)"
        )
    context_files = {DOCKERFILE: DOCKERFILE_SOURCE, **_package_files(CONTAINER_SOURCE, CONTAINER_PACKAGE)}
    digest = hashlib.sha256(f"base={base_image}\n{(tools or ImageTools()).hash_text()}".encode())
    for name, path in sorted(context_files.items()):
        content = path.read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return BuildContext(files=context_files, content_hash=digest.hexdigest())


def _package_files(folder: Traversable, prefix: str) -> dict[str, Traversable]:
    """Every file under `folder` by its context path (`prefix/...`), bytecode left out."""
    found: dict[str, Traversable] = {}
    for entry in folder.iterdir():
        name = f"{prefix}/{entry.name}"
        if entry.name in SKIPPED_PARTS:
            continue
        if entry.is_dir():
            found.update(_package_files(entry, name))
        elif entry.is_file() and Path(entry.name).suffix not in SKIPPED_SUFFIXES:
            found[name] = entry
    return found


def work_dir() -> Path:
    """Where builds keep their lock and the tools' downloads: build/image/ in a source checkout (make image,
    the tests); in a wheel install, the user's cache folder (site-packages is no place for them)."""
    if (SOURCE_ROOT / "pyproject.toml").is_file() and not SOURCE_ROOT.name.endswith("-packages"):
        return SOURCE_ROOT / CHECKOUT_WORK_DIR
    cache = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(cache) if Path(cache).is_absolute() else Path.home() / ".cache") / INSTALL_WORK_DIR


@contextmanager
def _build_lock(log: Callable[[str], None]) -> Iterator[None]:
    """One build at a time per checkout or user (test runs, make): two would race to tag the same image."""
    lock_path = work_dir() / BUILD_LOCK_FILE
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"image: waiting for another build to finish ({lock_path})")
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _docker_build(
    client: Any,
    image: str,
    build_from: str,
    base: str,
    context: BuildContext,
    *,
    nocache: bool,
    log: Callable[[str], None],
) -> None:
    with _context_tar(context) as tar_file:
        try:
            events = client.api.build(
                fileobj=tar_file,
                custom_context=True,
                tag=image,
                buildargs={"BASE_IMAGE": build_from},
                labels={LABEL_CONTENT_HASH: context.content_hash, LABEL_BASE_IMAGE: base},
                network_mode="none",
                nocache=nocache,
                pull=False,
                rm=True,
                forcerm=True,
                decode=True,
            )
            follow_build(events, image, log)
        except docker.errors.DockerException as exc:
            raise ImageBuildError(f"docker build of {image} failed: {short_error(exc)}") from exc


def follow_build(events: Iterable[dict[str, Any]], image: str, log: Callable[[str], None]) -> None:
    """A decoded `docker build` stream to its end: its output logged line by line, its error raised."""
    for event in events:
        if "error" in event:
            raise ImageBuildError(f"docker build of {image} failed: {str(event['error']).strip()}")
        for line in str(event.get("stream", "")).splitlines():
            if line.strip():
                log(f"  build: {line.rstrip()}")


@contextmanager
def _context_tar(context: BuildContext) -> Iterator[IO[bytes]]:
    """The context as an uncompressed tar with fixed owners, modes and times (same files, same bytes)."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX_BYTES) as spool:
        with tarfile.open(fileobj=spool, mode="w") as tar:
            directories: set[str] = set()
            for name, path in sorted(context.files.items()):
                for parent in reversed(Path(name).parents[:-1]):
                    if parent.as_posix() not in directories:
                        directories.add(parent.as_posix())
                        tar.addfile(_tar_entry(parent.as_posix(), tarfile.DIRTYPE, CONTEXT_DIR_MODE, 0))
                data = path.read_bytes()
                tar.addfile(_tar_entry(name, tarfile.REGTYPE, CONTEXT_FILE_MODE, len(data)), io.BytesIO(data))
        spool.seek(0)
        yield spool


def _tar_entry(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type = kind
    entry.mode = mode
    entry.size = size
    entry.mtime = 0
    return entry


def _image_labels(client: Any, image: str) -> dict[str, str] | None:
    """The image's labels ({} if none), or None when the engine does not have it."""
    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"cannot inspect {image}: {short_error(exc)}") from exc
    return dict(found.labels or {})


def _image_id(client: Any, image: str) -> str | None:
    try:
        return str(client.images.get(image).id)
    except docker.errors.ImageNotFound:
        return None


def _remove_if_unused(client: Any, image_id: str, log: Callable[[str], None]) -> None:
    # Each rebuild would otherwise leave the previous image behind, untagged; one in use stays.
    try:
        client.images.remove(image_id)
    except docker.errors.APIError as exc:
        log(f"image: previous image {image_id[:19]} kept ({short_error(exc)})")
        return
    log(f"image: removed the previous image {image_id[:19]}")


@contextmanager
def _docker_client() -> Iterator[Any]:
    try:
        client = docker.from_env(timeout=DOCKER_API_TIMEOUT_SECONDS)
        client.api.timeout = DOCKER_PING_TIMEOUT_SECONDS
        client.ping()
        client.api.timeout = DOCKER_API_TIMEOUT_SECONDS
    except docker.errors.DockerException as exc:
        raise ImageBuildError(
            f"Docker engine not reachable ({short_error(exc)}); start it (scripts/docker-engine.sh) or set DOCKER_HOST"
        ) from exc
    try:
        yield client
    finally:
        client.close()


def short_error(exc: BaseException) -> str:
    """A Docker error's own explanation (the engine's words), not the SDK's wrapper text."""
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()


def main(argv: list[str] | None = None) -> int:
    """`python -m runner.runtimes.image`: build the image if it is missing or stale."""
    parser = argparse.ArgumentParser(prog="python -m runner.runtimes.image", description=main.__doc__)
    parser.add_argument("--image", default=DEFAULT_IMAGE, help=f"image name (default {DEFAULT_IMAGE})")
    parser.add_argument("--base-image", default=None, help="base image to build on (default: automatic)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--if-missing", action="store_true", help="build only when no such image exists")
    mode.add_argument("--force", action="store_true", help="rebuild every layer even when current")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, flush=True)

    try:
        if args.if_missing and image_exists(args.image):
            _report_existing(args.image, log)
            return 0
        build_image(args.image, force=args.force, log=log, base_image=args.base_image)
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _report_existing(image: str, log: Callable[[str], None]) -> None:
    try:
        status = image_status(image)
    except ImageBuildError as exc:
        log(f"image: {image} exists (not checked for staleness: {exc})")
        return
    if status == "stale":
        log(f"image: {image} exists but is STALE (other sources, base or tools); rebuild: crewbot image build")
    else:
        log(f"image: {image} exists and is {status}")


if __name__ == "__main__":
    sys.exit(main())
