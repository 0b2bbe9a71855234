"""The image's build context and content hash (no Docker needed): what is sent is what is hashed, read from
the installed packages (tests/test_wheel.py builds it from a wheel install)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from runner.runtimes import image
from runner.runtimes.image import SOURCE_ROOT, ImageBuildError, collect_context, work_dir


def test_context_holds_the_dockerfile_and_the_agent_code_only() -> None:
    context = collect_context("base:1")

    assert context.files["Dockerfile"] == SOURCE_ROOT / "runner" / "runtimes" / "subagent.Dockerfile"
    assert context.files["container/__main__.py"] == SOURCE_ROOT / "container" / "__main__.py"
    assert not [name for name in context.files if "__pycache__" in name or name.endswith(".pyc")]
    assert all(name == "Dockerfile" or name.startswith("container/") for name in context.files)


def test_content_hash_follows_the_base_and_every_byte_of_the_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "container" / "sub").mkdir(parents=True)
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    agent = tmp_path / "container" / "agent.py"
    agent.write_text("x = 1\n")
    nested = tmp_path / "container" / "sub" / "tool.py"
    nested.write_text("y = 1\n")
    (tmp_path / "container" / "sub" / "tool.pyc").write_bytes(b"bytecode is not sent")
    monkeypatch.setattr(image, "DOCKERFILE_SOURCE", tmp_path / "Dockerfile")
    monkeypatch.setattr(image, "CONTAINER_SOURCE", tmp_path / "container")
    same = collect_context("base:1").content_hash

    assert sorted(collect_context("base:1").files) == ["Dockerfile", "container/agent.py", "container/sub/tool.py"]

    assert collect_context("base:1").content_hash == same
    assert collect_context("base:2").content_hash != same
    agent.write_text("x = 2\n")
    assert collect_context("base:1").content_hash != same
    agent.write_text("x = 1\n")
    nested.write_text("y = 2\n")
    assert collect_context("base:1").content_hash != same


def test_missing_package_data_names_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "DOCKERFILE_SOURCE", tmp_path / "subagent.Dockerfile")

    with pytest.raises(ImageBuildError, match=r"subagent\.Dockerfile or .* is missing: reinstall crewbot"):
        collect_context("base:1")


def test_a_checkout_keeps_its_build_files_in_build_image_an_install_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert work_dir() == SOURCE_ROOT / "build" / "image"
    monkeypatch.setattr(image, "SOURCE_ROOT", tmp_path / "lib" / "python3.11" / "site-packages")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert work_dir() == tmp_path / "cache" / "crewbot" / "image"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG rule: ignored unless absolute
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert work_dir() == tmp_path / "home" / ".cache" / "crewbot" / "image"


def imported_modules(path: Path) -> set[str]:
    """Every import in a module of `container/`, as a dotted name (`from a import b` gives `a.b`; a
    relative `from . import b` gives `container.b`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level > 0:
                module = ".".join(part for part in ("container", module) if part)
            names |= {f"{module}.{alias.name}" for alias in node.names}
    return names


def test_what_the_container_runs_imports_the_standard_library_only() -> None:
    """The image has no Python packages: a module the agent's process imports that needs one would fail
    only inside the container. `protocol.py` is the host's typed models of the contract, never imported there."""
    own = [path for path in (SOURCE_ROOT / "container").rglob("*.py") if path.name != "protocol.py"]
    assert len(own) > 5
    outside = {
        path.name: sorted(
            name
            for name in imported_modules(path)
            if name.startswith("container.protocol")
            or (name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "container")
        )
        for path in own
    }
    assert {name: found for name, found in outside.items() if found} == {}
