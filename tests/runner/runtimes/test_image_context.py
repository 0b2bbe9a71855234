"""The image's build context and content hash (no Docker needed): what is sent is what is hashed."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from runner.runtimes import image
from runner.runtimes.image import SOURCE_ROOT, collect_context


def test_context_holds_the_dockerfile_and_the_agent_code_only() -> None:
    context = collect_context("base:1")

    assert context.files["Dockerfile"] == SOURCE_ROOT / "Dockerfile"
    assert "container/__main__.py" in context.files
    assert not [name for name in context.files if "__pycache__" in name or name.endswith(".pyc")]
    assert all(name == "Dockerfile" or name.startswith("container/") for name in context.files)


def test_content_hash_follows_the_base_and_every_byte_of_the_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "container").mkdir()
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    agent = tmp_path / "container" / "agent.py"
    agent.write_text("x = 1\n")
    monkeypatch.setattr(image, "SOURCE_ROOT", tmp_path)
    same = collect_context("base:1").content_hash

    assert collect_context("base:1").content_hash == same
    assert collect_context("base:2").content_hash != same
    agent.write_text("x = 2\n")
    assert collect_context("base:1").content_hash != same


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
