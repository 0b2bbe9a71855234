"""The image's tool lists (no Docker needed): read as the settings read them, in the content hash only when
set, a key per base, and labels that carry the installed versions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from core.settings import Settings
from runner.runtimes import image
from runner.runtimes.image import LABEL_BASE_IMAGE, LABEL_CONTENT_HASH, collect_context, status_from_labels
from runner.runtimes.image_tools import (
    LABEL_APT,
    LABEL_PIP,
    LABEL_TOOLS_KEY,
    ImageTools,
    ToolsError,
    canonical_name,
    describe_tools,
    installed_tools,
    tool_labels,
    tools_from_settings,
)


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "container").mkdir()
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    (tmp_path / "container" / "agent.py").write_text("x = 1\n")
    monkeypatch.setattr(image, "DOCKERFILE_SOURCE", tmp_path / "Dockerfile")
    monkeypatch.setattr(image, "CONTAINER_SOURCE", tmp_path / "container")
    return tmp_path


def test_lists_are_sorted_without_repeats_and_checked_again() -> None:
    tools = ImageTools.of(["pandas", "numpy>=2,<3", "pandas"], ["poppler-utils", "git"])

    assert tools == ImageTools(pip=("numpy>=2,<3", "pandas"), apt=("git", "poppler-utils"))
    assert tools.pip_names() == ["numpy", "pandas"]
    assert tools.summary() == "pip numpy>=2,<3 pandas; apt git poppler-utils"
    assert not ImageTools() and ImageTools.of(apt=["bc"])
    for bad in ("https://evil.example/x.whl", "six; rm -rf /", "--index-url=http://x", "../wheel.whl", "a|b"):
        with pytest.raises(ValueError, match="not a package requirement"):
            ImageTools.of([bad])
    with pytest.raises(ValueError, match="not a Debian package name"):
        ImageTools.of(apt=["-oAPT::Foo=1"])


def test_no_tools_leave_the_content_hash_as_it_always_was(sources: Path) -> None:
    """The default image stays current across this change: with no tools the hash is the old formula."""
    digest = hashlib.sha256(b"base=base:1\n")
    for name in ("Dockerfile", "container/agent.py"):
        content = (sources / name).read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode() + content)

    assert collect_context("base:1").content_hash == digest.hexdigest()
    assert collect_context("base:1", ImageTools()).content_hash == digest.hexdigest()


def test_content_hash_follows_each_list_but_not_their_order(sources: Path) -> None:
    none = collect_context("base:1").content_hash
    pip = collect_context("base:1", ImageTools.of(["pandas", "matplotlib"])).content_hash
    apt = collect_context("base:1", ImageTools.of(apt=["pandas"])).content_hash

    assert len({none, pip, apt}) == 3
    assert collect_context("base:1", ImageTools.of(["matplotlib", "pandas"])).content_hash == pip
    assert collect_context("base:1", ImageTools.of(["pandas", "matplotlib>=3"])).content_hash != pip
    assert collect_context("base:2", ImageTools.of(["pandas", "matplotlib"])).content_hash != pip


def test_status_from_labels_is_stale_when_the_tools_changed(sources: Path) -> None:
    tools = ImageTools.of(["six"], ["bc"])
    labels = {LABEL_BASE_IMAGE: "base:1", LABEL_CONTENT_HASH: collect_context("base:1", tools).content_hash}

    assert status_from_labels(labels, tools) == "current"
    assert status_from_labels(labels, ImageTools.of(["six"])) == "stale"
    assert status_from_labels(labels, ImageTools()) == "stale"
    assert status_from_labels({LABEL_CONTENT_HASH: labels[LABEL_CONTENT_HASH]}, tools) == "stale"


def test_key_names_the_tools_on_one_exact_base() -> None:
    tools = ImageTools.of(["six"])

    assert tools.key("sha256:aaa") == tools.key("sha256:aaa")
    assert len({tools.key("sha256:aaa"), tools.key("sha256:bbb"), ImageTools.of(["idna"]).key("sha256:aaa")}) == 3


def test_settings_are_read_from_the_environment_and_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert tools_from_settings() == ImageTools()
    (tmp_path / ".env").write_text("SUBAGENT_IMAGE_APT=poppler-utils,git\nTELEGRAM_BOT_TOKEN=not-checked-here\n")
    monkeypatch.setenv("SUBAGENT_IMAGE_PACKAGES", "pandas numpy>=2,<3")

    assert tools_from_settings() == ImageTools(pip=("numpy>=2,<3", "pandas"), apt=("git", "poppler-utils"))


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("SUBAGENT_IMAGE_PACKAGES", "pandas https://evil.example/x.whl", "invalid setting SUBAGENT_IMAGE_PACKAGES: "),
        ("SUBAGENT_IMAGE_PACKAGES", "six$(reboot)", "invalid setting SUBAGENT_IMAGE_PACKAGES: "),
        ("SUBAGENT_IMAGE_APT", "bc;reboot", "invalid setting SUBAGENT_IMAGE_APT: "),
    ],
)
def test_bad_settings_stop_the_build_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)

    with pytest.raises(ToolsError) as raised:
        tools_from_settings()
    assert str(raised.value).startswith(expected)
    assert "\n" not in str(raised.value)


def test_the_build_reads_the_settings_the_bot_reads() -> None:
    aliases = {info.alias for info in Settings.model_fields.values()}
    assert {"SUBAGENT_IMAGE_PACKAGES", "SUBAGENT_IMAGE_APT"} <= aliases


def test_labels_carry_the_installed_versions() -> None:
    labels = tool_labels("k" * 64, {"pandas": "2.2.3", "matplotlib": "3.9.2"}, {"poppler-utils": "22.12.0-2"})

    assert labels[LABEL_TOOLS_KEY] == "k" * 64
    assert installed_tools(labels) == ({"pandas": "2.2.3", "matplotlib": "3.9.2"}, {"poppler-utils": "22.12.0-2"})
    assert describe_tools(labels) == "tools: pandas 2.2.3, matplotlib 3.9.2; apt: poppler-utils 22.12.0-2"
    assert describe_tools(tool_labels("k", {}, {"bc": "1.07.1-3+b1"})) == "apt: bc 1.07.1-3+b1"
    assert describe_tools({}) == describe_tools({LABEL_PIP: "not json", LABEL_APT: "[1]"}) == "no extra tools"


@pytest.mark.parametrize(
    ("spec", "name"),
    [("pandas", "pandas"), ("Pypdf[full]>=4", "pypdf"), ("ruamel.yaml", "ruamel-yaml"), ("Foo__Bar==1", "foo-bar")],
)
def test_canonical_name(spec: str, name: str) -> None:
    assert canonical_name(spec) == name
