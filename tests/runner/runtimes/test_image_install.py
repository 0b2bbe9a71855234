"""Tools baked into an image for real: `six` from the package index and `bc` from Debian, fetched on the host,
installed in an image of its own tag (the default image is never touched), used by a container with no
network; then a failing fetch leaves that image as it was. The images and the download cache are removed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from runner.runtimes.docker_runtime import DockerRuntime
from runner.runtimes.image import LABEL_CONTENT_HASH, ImageBuildError, build_image, image_status
from runner.runtimes.image_install import tools_repository
from runner.runtimes.image_tools import LABEL_TOOLS_KEY, ImageTools, describe_tools, installed_tools
from tests.runner.docker_helpers import TEST_LABEL

pytestmark = pytest.mark.docker

IMAGE = "crewbot-test-tools:latest"
TOOLS = ImageTools.of(["six"], ["bc"])
ENGINE_TIMEOUT_SECONDS = 600


@dataclass(frozen=True, slots=True)
class Built:
    client: Any
    cache: Path
    log: list[str]


def remove_test_images(client: Any) -> None:
    for name in (IMAGE, tools_repository(IMAGE)):
        for found in client.images.list(name=name):
            for tag in found.tags:
                with contextlib.suppress(docker.errors.NotFound):
                    client.images.remove(tag, force=True)


@pytest.fixture(scope="module")
def built(docker_engine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    client = docker.from_env(timeout=ENGINE_TIMEOUT_SECONDS)
    cache = tmp_path_factory.mktemp("tools-cache")
    log: list[str] = []
    remove_test_images(client)
    try:
        build_image(IMAGE, tools=TOOLS, cache_dir=cache, log=log.append)
        yield Built(client=client, cache=cache, log=log)
    finally:
        remove_test_images(client)
        client.close()


def run(client: Any, command: list[str], user: str = "1000:1000") -> tuple[int, str]:
    container = client.containers.run(
        IMAGE,
        command[1:],
        entrypoint=command[:1],
        detach=True,
        network_mode="none",
        read_only=True,
        tmpfs={"/tmp": "rw,size=16m"},
        user=user,
        cap_drop=["ALL"] if user != "0:0" else None,  # root reads every folder to search them all
        labels={TEST_LABEL: "test_image_install"},
    )
    try:
        code = int(container.wait(timeout=120)["StatusCode"])
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def test_the_tools_work_in_a_container_without_network(built: Built) -> None:
    assert run(built.client, ["/opt/venv/bin/python", "-c", "import six; print(six.__version__)"]) == (0, "1.17.0\n")
    assert run(built.client, ["/bin/sh", "-c", "echo 2+3 | bc"]) == (0, "5\n")
    # The downloads were mounted into the install container, never copied: no layer holds them.
    found = ["find", "/", "-xdev", "(", "-name", "six-*.whl", "-o", "-name", "bc_*.deb", ")", "-print"]
    assert run(built.client, found, user="0:0") == (0, "")


def test_the_image_says_what_it_holds_and_is_current_for_these_tools_only(built: Built) -> None:
    config = built.client.images.get(IMAGE).attrs["Config"]
    labels = config["Labels"]

    pip_versions, apt_versions = installed_tools(labels)
    assert (pip_versions, list(apt_versions)) == ({"six": "1.17.0"}, ["bc"])
    assert apt_versions["bc"].startswith("1.07")
    assert len(labels[LABEL_TOOLS_KEY]) == 64 and len(labels[LABEL_CONTENT_HASH]) == 64
    assert not config.get("Volumes")  # the install container's mount left nothing in the image's config
    assert config["Entrypoint"] == ["/opt/venv/bin/python", "-P", "-m", "container"]
    assert image_status(IMAGE, TOOLS) == "current"
    assert image_status(IMAGE, ImageTools.of(["six"])) == "stale"
    assert image_status(IMAGE, ImageTools()) == "stale"
    assert any(line.startswith("image: fetched 1 wheel(s)") for line in built.log), built.log
    assert any(line.startswith("image: fetched 1 .deb file(s)") for line in built.log), built.log


def test_a_second_build_is_a_no_op_and_a_failed_fetch_leaves_the_image(built: Built) -> None:
    before = built.client.images.get(IMAGE).id
    log: list[str] = []
    build_image(IMAGE, tools=TOOLS, cache_dir=built.cache, log=log.append)
    assert log[-1].startswith(f"image: {IMAGE} is up to date")

    with pytest.raises(ImageBuildError) as raised:
        build_image(IMAGE, tools=ImageTools.of(["six==0.0.1"]), cache_dir=built.cache, log=log.append)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("cannot fetch SUBAGENT_IMAGE_PACKAGES (six==0.0.1)")
    assert "No matching distribution found for six==0.0.1" in message
    assert message.endswith(f"({IMAGE} left as it was)")
    assert built.client.images.get(IMAGE).id == before
    assert not built.client.containers.list(all=True, filters={"name": "crewbot-image-tools-"})


async def test_the_runtime_reads_the_labels_doctor_shows(built: Built) -> None:
    runtime = DockerRuntime(max_concurrency=1)
    try:
        labels = await runtime.image_labels(IMAGE)
        missing = await runtime.image_labels("crewbot-no-such-image:never")
    finally:
        await runtime.close()

    assert labels is not None and describe_tools(labels) == (
        f"tools: six 1.17.0; apt: bc {installed_tools(labels)[1]['bc']}"
    )
    assert missing is None
