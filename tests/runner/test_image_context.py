"""The image's build context and content hash (no Docker needed): what is sent is what is hashed."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

from runner.image import SOURCE_ROOT, WHEELS_IN_CONTEXT, collect_context
from runner.image_wheels import (
    IMAGE_REQUIREMENTS,
    STAMP_FILE,
    Wheelhouse,
    ensure_wheelhouse,
    pinned_requirements,
    target_platforms,
    wheelhouse_is_current,
    wheelhouse_stamp,
)


def fake_wheelhouse(tmp_path: Path, *names: str) -> Wheelhouse:
    tmp_path.mkdir(exist_ok=True)
    for name in names:
        (tmp_path / name).write_bytes(b"not really a wheel")
    (tmp_path / "requirements.txt").write_text("pydantic==2\n")
    return Wheelhouse(path=tmp_path, wheels=tuple(sorted(names)))


def test_context_holds_dockerfile_agent_code_and_wheels(tmp_path: Path) -> None:
    context = collect_context(fake_wheelhouse(tmp_path, "a-1-py3-none-any.whl"), "base:1")

    assert "Dockerfile" in context.files
    assert "container/__main__.py" in context.files
    assert "container/protocol.py" in context.files
    assert f"{WHEELS_IN_CONTEXT}/a-1-py3-none-any.whl" in context.files
    assert f"{WHEELS_IN_CONTEXT}/requirements.txt" in context.files
    assert not [name for name in context.files if "__pycache__" in name or name.endswith(".pyc")]
    assert all(name.startswith(("Dockerfile", "container/", WHEELS_IN_CONTEXT)) for name in context.files)
    assert context.files["Dockerfile"] == SOURCE_ROOT / "Dockerfile"


def test_content_hash_follows_base_and_wheels(tmp_path: Path) -> None:
    wheels = fake_wheelhouse(tmp_path / "one", "a-1-py3-none-any.whl")
    same = collect_context(wheels, "base:1").content_hash

    assert collect_context(wheels, "base:1").content_hash == same
    assert collect_context(wheels, "base:2").content_hash != same
    other_wheels = fake_wheelhouse(tmp_path / "two", "a-2-py3-none-any.whl")
    assert collect_context(other_wheels, "base:1").content_hash != same


def test_requirements_are_pinned_to_the_host_versions() -> None:
    pinned = pinned_requirements()
    assert [line.split("==")[0] for line in pinned] == list(IMAGE_REQUIREMENTS)
    assert all(line.count("==") == 1 and line.split("==")[1] for line in pinned)


def test_target_platforms_cover_bookworm_glibc_and_manylinux2014() -> None:
    platforms = target_platforms()
    assert platforms[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in platforms  # manylinux2014 wheels


def test_wheelhouse_cache_follows_the_host_versions_of_its_wheels(tmp_path: Path) -> None:
    """A complete wheelhouse is reused as long as the host has each wheel's version; no pip is run."""
    copy = tmp_path / "wheels"
    copy.mkdir()
    (copy / STAMP_FILE).write_text(wheelhouse_stamp())
    (copy / f"pydantic-{version('pydantic')}-py3-none-any.whl").write_bytes(b"placeholder")

    assert wheelhouse_is_current(copy)
    lines: list[str] = []
    assert ensure_wheelhouse(copy, lines.append).wheels == (f"pydantic-{version('pydantic')}-py3-none-any.whl",)
    assert lines == [f"wheelhouse: 1 wheels cached in {copy}"]

    (copy / "pydantic-0.0.1-py3-none-any.whl").write_bytes(b"placeholder")
    assert not wheelhouse_is_current(copy)
    assert not wheelhouse_is_current(tmp_path / "missing")
