"""scripts/host_image.py's own checks, fast and without building: the wheel is built from a copy that holds only
the packages (never the checkout's build/ scratch), and a wrong Python or a missing engine is one line, before
any engine work."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("host_image_script", ROOT / "scripts" / "host_image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_module_left_in_the_checkouts_build_folder_is_not_in_the_wheel(tmp_path: Path) -> None:
    script = load_script()
    checkout = script.copy_sources(ROOT, tmp_path / "checkout")
    # What setuptools leaves from an earlier build: a module deleted from the sources since, still in build/lib.
    stale = checkout / "build" / "lib" / "bot" / "zz_deleted_since.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("STALE = True\n", encoding="utf-8")
    copy = script.copy_sources(checkout, tmp_path / "copy")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("crewbot-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "bot/commands.py" in names
    assert "bot/zz_deleted_since.py" not in names
    assert not any("__pycache__" in name for name in names)


def test_a_python_the_image_does_not_run_is_refused_before_the_engine_is_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script()
    monkeypatch.setattr(script, "BASE_PYTHON", (3, 99))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert script.main([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the image's is 3.99" in err and "Docker" not in err


def test_no_engine_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script()
    monkeypatch.setattr(script, "BASE_PYTHON", sys.version_info[:2])
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert script.main(["--root", str(ROOT)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: Docker engine not reachable") and "make engine" in err
