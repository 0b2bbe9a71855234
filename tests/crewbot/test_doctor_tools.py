"""`crewbot doctor`'s image line: current or stale against SUBAGENT_IMAGE_PACKAGES/APT, and the tools with
their versions, from the image's labels (a fake engine: no Docker needed)."""

from __future__ import annotations

from pathlib import Path

from crewbot.doctor import run_doctor
from runner.runtimes.image import LABEL_BASE_IMAGE, LABEL_CONTENT_HASH, collect_context
from runner.runtimes.image_tools import ImageTools, tool_labels
from tests.fakes.memory_runtime import MemoryContainer, MemoryRuntime
from tests.harness import make_settings

IMAGE = "crewbot-agent:latest"
BASE = "crewbot-base:bookworm"
TOOLS = ImageTools.of(["pandas", "matplotlib"], ["poppler-utils"])


class LabelledRuntime(MemoryRuntime):
    """The fake engine, with labels on its image as DockerRuntime.image_labels reads them."""

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__(images={IMAGE}, on_start=prints_python)
        self.labels = labels

    async def image_labels(self, image: str) -> dict[str, str] | None:
        return self.labels if image in (self.images or {image}) else None


async def prints_python(container: MemoryContainer) -> int | None:
    container.logs = b"3.11.2\n"
    return 0


def built_with(tools: ImageTools) -> dict[str, str]:
    labels = {LABEL_BASE_IMAGE: BASE, LABEL_CONTENT_HASH: collect_context(BASE, tools).content_hash}
    if tools:
        versions = {"pandas": "2.2.3", "matplotlib": "3.9.2"}
        labels |= tool_labels("k" * 64, versions, {"poppler-utils": "22.12.0-2+deb12u3"})
    return labels


async def image_line(tmp_path: Path, labels: dict[str, str], **settings: object) -> str:
    lines: list[str] = []
    async with LabelledRuntime(labels) as runtime:
        await run_doctor(make_settings(tmp_path / "data", None, **settings), out=lines.append, runtime=runtime)
    return next(line for line in lines if line.split()[1] == "image")


async def test_a_current_image_lists_its_tools_and_versions(tmp_path: Path) -> None:
    line = await image_line(
        tmp_path,
        built_with(TOOLS),
        SUBAGENT_IMAGE_PACKAGES="pandas matplotlib",
        SUBAGENT_IMAGE_APT="poppler-utils",
    )

    assert line == (
        f"ok   image     {IMAGE}: current; tools: pandas 2.2.3, matplotlib 3.9.2; apt: poppler-utils 22.12.0-2+deb12u3"
    )


async def test_the_default_image_has_no_extra_tools(tmp_path: Path) -> None:
    assert await image_line(tmp_path, built_with(ImageTools())) == f"ok   image     {IMAGE}: current; no extra tools"


async def test_an_image_without_the_tools_now_asked_for_is_stale(tmp_path: Path) -> None:
    line = await image_line(tmp_path, built_with(ImageTools()), SUBAGENT_IMAGE_PACKAGES="pandas")

    assert line.startswith(f"FAIL image     {IMAGE} is stale: built from other sources, another base or other tools")
    assert "it holds no extra tools" in line
    assert line.endswith("fix: `crewbot image build` (`make run` rebuilds it too)")


async def test_an_image_crewbot_did_not_build(tmp_path: Path) -> None:
    line = await image_line(tmp_path, {"org.opencontainers.image.title": "custom"})

    assert line == f"ok   image     {IMAGE}: not made by `crewbot image build` (freshness and tools unknown)"
