"""Fetching the image's tools on the host (no Docker, no network): the commands are argument lists with
the requirements after `--`, pip is told the base's Python and every manylinux tag its glibc runs, apt works
from a private state seeded with the base's dpkg status, failures are one line, and a finished fetch is reused."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.runtimes import image_fetch
from runner.runtimes.image_fetch import (
    BaseFacts,
    Fetched,
    apt_download_command,
    apt_options,
    fetch_tools,
    pip_download_command,
    pip_platforms,
    run_fetch,
    sources_list,
)
from runner.runtimes.image_install import (
    apt_install_command,
    pip_install_command,
    tools_image_name,
    venv_first_env,
)
from runner.runtimes.image_tools import ImageTools, ToolsError

BOOKWORM = BaseFacts(
    python=(3, 11),
    implementation="cpython",
    machine="x86_64",
    glibc=(2, 36),
    codename="bookworm",
    dpkg_arch="amd64",
    dpkg_status="Package: libc6\nStatus: install ok installed\n",
)


def report(**changes: Any) -> str:
    facts: dict[str, Any] = {
        "python": [3, 11],
        "implementation": "cpython",
        "machine": "x86_64",
        "glibc": "glibc 2.36",
        "codename": "bookworm",
        "dpkg_arch": "amd64",
        "dpkg_status": BOOKWORM.dpkg_status,
    }
    return "some noise\n" + json.dumps(facts | changes) + "\n"


def test_the_probe_report_is_parsed() -> None:
    assert BaseFacts.from_report(report()) == BOOKWORM
    assert BaseFacts.from_report(report(glibc="")).glibc is None
    assert BOOKWORM.where() == "Python 3.11, glibc 2.36, x86_64"
    with pytest.raises(ToolsError, match="did not describe itself"):
        BaseFacts.from_report("Traceback (most recent call last):\n")


def test_platforms_are_every_manylinux_tag_the_glibc_runs() -> None:
    tags = pip_platforms(BOOKWORM)

    assert tags[0] == "manylinux_2_36_x86_64"
    assert tags.index("manylinux_2_17_x86_64") + 1 == tags.index("manylinux2014_x86_64")
    assert "manylinux2010_x86_64" in tags and tags[-2:] == ["manylinux_2_5_x86_64", "manylinux1_x86_64"]
    assert len(tags) == 32 + 3
    arm = pip_platforms(BaseFacts(**{**_fields(BOOKWORM), "machine": "aarch64", "glibc": (2, 28)}))
    assert arm == [f"manylinux_2_{minor}_aarch64" for minor in range(28, 17, -1)] + [
        "manylinux_2_17_aarch64",
        "manylinux2014_aarch64",
    ]
    with pytest.raises(ToolsError, match="needs a base image with glibc"):
        pip_platforms(BaseFacts(**{**_fields(BOOKWORM), "glibc": None}))


def test_pip_download_is_an_argument_list_with_the_requirements_after_the_options(tmp_path: Path) -> None:
    specs = ["numpy>=2,<3", "pypdf[full]"]
    command = pip_download_command(BOOKWORM, tmp_path, specs, python="/venv/bin/python")

    assert command[:4] == ["/venv/bin/python", "-m", "pip", "download"]
    assert command[-3:] == ["--", "numpy>=2,<3", "pypdf[full]"]
    options = command[: command.index("--")]
    for option in ("--only-binary=:all:", "--no-input", "--disable-pip-version-check"):
        assert option in options
    pairs = dict(itertools.pairwise(options))
    assert pairs["--dest"] == str(tmp_path)
    assert (pairs["--python-version"], pairs["--implementation"], pairs["--abi"]) == ("3.11", "cp", "cp311")
    assert [options[i + 1] for i, word in enumerate(options) if word == "--platform"] == pip_platforms(BOOKWORM)
    assert "--no-deps" not in command
    assert pip_download_command(BOOKWORM, tmp_path, ["pip"], no_deps=True)[-3:] == ["--no-deps", "--", "pip"]
    with pytest.raises(ToolsError, match="CPython"):
        pip_download_command(BaseFacts(**{**_fields(BOOKWORM), "implementation": "pypy"}), tmp_path, specs)


def test_apt_works_from_its_own_state_and_downloads_only(tmp_path: Path) -> None:
    options = apt_options(tmp_path / "apt", tmp_path / "debs", "amd64")
    settings = dict(value.split("=", 1) for value in options[1::2])

    assert options[::2] == ["-o"] * len(settings)
    for name in ("Dir::Etc::SourceList", "Dir::Etc::SourceParts", "Dir::State", "Dir::State::status", "Dir::Cache"):
        assert settings[name].startswith(str(tmp_path / "apt")), name
    assert settings["Dir::Cache::archives"] == str(tmp_path / "debs")
    assert settings["APT::Architecture"] == "amd64"
    command = apt_download_command(options, ["poppler-utils", "git"])
    assert command[0] == "apt-get" and command[-4:] == ["install", "--", "poppler-utils", "git"]
    assert {"--download-only", "--no-install-recommends", "--no-remove", "-y"} <= set(command)
    assert "bookworm-security main" in sources_list("bookworm")
    assert sources_list("bookworm").count("[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]") == 3


def test_install_commands_in_the_container_take_the_fetched_files_after_double_dash() -> None:
    apt = apt_install_command(["debs/bc_1.07.1-3+b1_amd64.deb"])
    assert apt[:3] == ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
    assert apt[-2:] == ["--", "/tmp/crewbot-tools/debs/bc_1.07.1-3+b1_amd64.deb"]
    pip = pip_install_command("pip/pip-26.3-py3-none-any.whl", ["six", "idna>=3"])
    assert pip[:3] == ["/opt/venv/bin/python", "/tmp/crewbot-tools/pip/pip-26.3-py3-none-any.whl/pip", "install"]
    assert {"--no-index", "--no-cache-dir"} <= set(pip) and pip[
        pip.index("--find-links") + 1
    ] == "/tmp/crewbot-tools/wheels"
    assert pip[-3:] == ["--", "six", "idna>=3"]


def test_a_tools_image_puts_its_venv_first_on_the_path() -> None:
    # The subagent's `python3` and `python` are then the venv's, which holds SUBAGENT_IMAGE_PACKAGES.
    base = ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]
    assert venv_first_env(base) == ["PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]
    assert venv_first_env(venv_first_env(base)) == venv_first_env(base)
    assert venv_first_env(None) == ["PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


def test_tools_image_names() -> None:
    key = "0123456789abcdef" * 4
    assert tools_image_name("crewbot-agent:latest", key) == "crewbot-agent-tools:0123456789abcdef"
    assert tools_image_name("registry:5000/team/agent", key) == "registry:5000/team/agent-tools:0123456789abcdef"
    assert tools_image_name("registry:5000/agent:v2", key) == "registry:5000/agent-tools:0123456789abcdef"


def fails_with(output: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; print({output!r}); sys.exit(1)"]


def test_a_failed_fetch_is_one_line_naming_the_package_and_why() -> None:
    pip_output = (
        "Collecting six==0.0.1\n"
        "ERROR: Could not find a version that satisfies the requirement six==0.0.1 (from versions: 1.0, 1.1)\n"
        "ERROR: No matching distribution found for six==0.0.1"
    )
    with pytest.raises(ToolsError) as raised:
        run_fetch(fails_with(pip_output), "cannot fetch X", 30, image_fetch._pip_reason)
    assert str(raised.value) == (
        "cannot fetch X: No matching distribution found for six==0.0.1 "
        "(only wheels are used, built for the image's Python and platform)"
    )
    apt_output = "Reading package lists...\nE: Unable to locate package nosuch\nE: Unable to locate package nosuch"
    with pytest.raises(ToolsError, match=r"^cannot fetch Y: Unable to locate package nosuch$"):
        run_fetch(fails_with(apt_output), "cannot fetch Y", 30, image_fetch._apt_reason)
    with pytest.raises(ToolsError, match="could not run"):
        run_fetch(["/nonexistent/crewbot-no-such-tool"], "cannot fetch Z", 30, image_fetch._apt_reason)
    with pytest.raises(ToolsError, match=r"did not finish within 0\.5 s"):
        run_fetch([sys.executable, "-c", "import time; time.sleep(5)"], "cannot fetch Z", 0.5, image_fetch._pip_reason)


def test_a_finished_fetch_is_reused_and_a_damaged_one_fetched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def fake_pip(facts: BaseFacts, tools: ImageTools, cache: Path, log: object) -> dict[str, Any]:
        calls.append("pip")
        for name in ("pip/pip-26.3-py3-none-any.whl", "wheels/six-1.17.0-py2.py3-none-any.whl"):
            (cache / name).parent.mkdir(parents=True, exist_ok=True)
            (cache / name).write_bytes(b"wheel")
        return {"pip": "pip/pip-26.3-py3-none-any.whl", "wheels": ["wheels/six-1.17.0-py2.py3-none-any.whl"]}

    def fake_apt(facts: BaseFacts, tools: ImageTools, cache: Path, log: object) -> dict[str, Any]:
        calls.append("apt")
        (cache / "debs").mkdir(exist_ok=True)
        (cache / "debs" / "bc_1_amd64.deb").write_bytes(b"deb")
        return {"debs": ["debs/bc_1_amd64.deb"]}

    monkeypatch.setattr(image_fetch, "_fetch_pip", fake_pip)
    monkeypatch.setattr(image_fetch, "_fetch_apt", fake_apt)
    tools = ImageTools.of(["six"], ["bc"])
    expected = Fetched(
        pip_wheel="pip/pip-26.3-py3-none-any.whl",
        wheels=("wheels/six-1.17.0-py2.py3-none-any.whl",),
        debs=("debs/bc_1_amd64.deb",),
    )

    assert fetch_tools(BOOKWORM, tools, tmp_path, print) == expected
    assert fetch_tools(BOOKWORM, tools, tmp_path, print) == expected
    assert calls == ["pip", "apt"]
    (tmp_path / "debs" / "bc_1_amd64.deb").unlink()
    assert fetch_tools(BOOKWORM, tools, tmp_path, print) == expected
    assert calls == ["pip", "apt", "apt"]


def _fields(facts: BaseFacts) -> dict[str, Any]:
    return {name: getattr(facts, name) for name in BaseFacts.__slots__}
