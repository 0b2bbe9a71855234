"""The suite's leak guard (tests/leak_guard.py) fails the test that leaves something behind, names what it
left, and removes it: checked by running the guard on probe tests in a pytest of their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import docker
import pytest

from tests.runner.docker_helpers import TEST_LABEL

REPO = Path(__file__).resolve().parent.parent
PROBE_TIMEOUT_SECONDS = 240
PROBE_OPTIONS = ("-p", "tests.leak_guard", "-p", "no:cacheprovider", "-q")

LEAKY_PROBES = """
import pathlib, socket, subprocess, tempfile

def test_leaves_a_process():
    child = subprocess.Popen(["sleep", "300"])
    pathlib.Path(__file__).with_name("child.pid").write_text(str(child.pid))

def test_leaves_a_temp_dir():
    tempfile.mkdtemp(prefix="left-")

LISTENERS = []

def test_leaves_a_listening_socket():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    LISTENERS.append(server)

def test_cleans_up():
    with tempfile.TemporaryDirectory():
        subprocess.run(["true"], check=True)
"""

CONTAINER_PROBE = """
import docker, pytest
import tests.leak_guard

# No owner is removing this container: the guard's grace for one that is (15 s) would only be waited out.
tests.leak_guard.CONTAINER_GONE_WAIT_SECONDS = 0.0

@pytest.fixture
def docker_engine():
    yield

def test_leaves_a_container(docker_engine):
    client = docker.from_env()
    client.containers.run(
        "{image}", ["sleep", "300"], detach=True, network_mode="none", labels={{"{label}": "{value}"}}
    )
    client.close()
"""


def run_probe(tmp_path: Path, source: str) -> str:
    probe = tmp_path / "test_probe.py"
    probe.write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "/dev/null", "--rootdir", str(tmp_path), *PROBE_OPTIONS, str(probe)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_SECONDS,
    )
    return done.stdout + done.stderr


def test_each_leak_fails_the_test_that_left_it_and_is_removed(tmp_path: Path) -> None:
    output = run_probe(tmp_path, LEAKY_PROBES)
    assert "4 passed, 3 errors" in output, output
    assert "ERROR at teardown of test_leaves_a_process" in output and "child processes still running" in output
    assert "ERROR at teardown of test_leaves_a_temp_dir" in output and "temporary files left in" in output
    assert "ERROR at teardown of test_leaves_a_listening_socket" in output and "sockets still listening" in output
    assert "test_cleans_up" not in output.split("short test summary")[-1]
    child = int((tmp_path / "child.pid").read_text())
    assert not Path(f"/proc/{child}").exists()  # ended by the guard, not left to the probe's exit


@pytest.mark.docker
def test_a_container_left_running_fails_its_test_and_is_removed(tmp_path: Path, subagent_image: str) -> None:
    value = f"leak-probe-{tmp_path.name}"
    output = run_probe(tmp_path, CONTAINER_PROBE.format(image=subagent_image, label=TEST_LABEL, value=value))
    assert "1 passed, 1 error" in output, output
    assert "ERROR at teardown of test_leaves_a_container" in output and "containers still there" in output
    client = docker.from_env()
    try:
        assert client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={value}"}) == []
    finally:
        client.close()
