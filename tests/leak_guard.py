"""Suite-wide guard: a test that leaves a container, a child process, a listening socket or a temporary
file behind fails at its teardown, naming what it left; the guard then removes it, so the next test starts
clean whatever this one did.

What counts is what a test's body started and its teardown did not end: the guard compares the state after
the test's teardown with the state once its fixtures were set up (a module-scoped rig's server or app
belongs to the module, not to the first test that set it up). Containers are those of the app (label
`crewbot`) and of the engine tests (label `crewbot.test`); one that is still exiting gets a few seconds to
be removed by whoever owns it before it counts as left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runner.runtimes.runtime import LABEL_APP
from tests.runner.docker_helpers import TEST_LABEL

CONTAINER_GONE_WAIT_SECONDS = 15.0  # a finished run's container is removed just after its result is recorded
CONTAINER_POLL_SECONDS = 0.2
ENGINE_TIMEOUT_SECONDS = 30
DEFAULT_ENGINE = "unix:///var/run/docker.sock"  # where the Docker SDK looks when DOCKER_HOST is not set
PROCESS_EXIT_WAIT_SECONDS = 5.0
TEMP_DIR_PREFIX = "crewbot-tests-"  # short: Unix socket paths made under it must stay under 108 bytes


@dataclass(frozen=True, slots=True)
class Snapshot:
    containers: frozenset[str] = frozenset()
    children: frozenset[int] = frozenset()
    listening: frozenset[str] = frozenset()
    temp_entries: frozenset[str] = frozenset()


@dataclass(slots=True)
class GuardState:
    temp_dir: Path
    docker_host: str  # the engine as the session found it: a test may point DOCKER_HOST elsewhere
    baselines: dict[str, Snapshot] = field(default_factory=dict)


STATE_KEY = pytest.StashKey[GuardState]()


# -- what exists now -------------------------------------------------------------------------------


def uses_docker(item: pytest.Item) -> bool:
    return "docker_engine" in getattr(item, "fixturenames", ())


def engine(state: GuardState) -> Any:
    import docker

    return docker.DockerClient(base_url=state.docker_host, timeout=ENGINE_TIMEOUT_SECONDS)


def test_containers(state: GuardState) -> dict[str, str]:
    """Id -> name of every container the app or an engine test started, running or not."""
    client = engine(state)
    try:
        found: dict[str, str] = {}
        for label in (LABEL_APP, TEST_LABEL):
            for container in client.containers.list(all=True, sparse=True, filters={"label": label}):
                found[container.id] = str(container.attrs.get("Names") or container.id[:12])
        return found
    finally:
        client.close()


def remove_containers(state: GuardState, ids: set[str]) -> None:
    from docker.errors import NotFound

    client = engine(state)
    try:
        for container_id in ids:
            with contextlib.suppress(NotFound):  # removed by its owner meanwhile
                client.containers.get(container_id).remove(force=True)
    finally:
        client.close()


def _child_pids(me: int) -> list[str]:
    """Candidate pids: the `children` file of each of this process's threads, or every pid where the kernel
    has none (reading every /proc/<pid>/stat, twice for each test, took some 20 s of a run)."""
    try:
        threads = list(os.scandir(f"/proc/{me}/task"))
        return [pid for thread in threads for pid in Path(thread.path, "children").read_text().split()]
    except OSError:
        return [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]


def child_processes() -> dict[int, str]:
    """Pid -> command of this process's children that are alive (zombies are reaped by whoever waits)."""
    me = os.getpid()
    found: dict[int, str] = {}
    for pid in _child_pids(me):
        try:
            stat = Path("/proc", pid, "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == me and state != "Z":
            found[int(pid)] = comm
    return found


def _listening_address(fd: int) -> str | None:
    """The address `fd` listens on (None: not a listening socket). Asked of a duplicate of the descriptor:
    reading /proc/net/tcp and tcp6 instead took about 10 ms, twice for every test."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:  # closed meanwhile, or not a socket after all
        return None
    try:
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return None
        kind = "unix" if sock.family == socket.AF_UNIX else "tcp"
        return f"{kind} {sock.getsockname() or '(unnamed)'}"
    except OSError:
        return None
    finally:
        sock.close()


def listening_sockets() -> dict[str, str]:
    """Inode -> address of every socket this process listens on."""
    listening: dict[str, str] = {}
    for entry in os.scandir("/proc/self/fd"):
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue
        if target.startswith("socket:[") and (address := _listening_address(int(entry.name))) is not None:
            listening[target[len("socket:[") : -1]] = address
    return listening


def temp_entries(temp_dir: Path) -> set[str]:
    return {entry.name for entry in os.scandir(temp_dir)}


def snapshot(item: pytest.Item, state: GuardState) -> Snapshot:
    return Snapshot(
        containers=frozenset(test_containers(state)) if uses_docker(item) else frozenset(),
        children=frozenset(child_processes()),
        listening=frozenset(listening_sockets()),
        temp_entries=frozenset(temp_entries(state.temp_dir)),
    )


# -- what a test left ------------------------------------------------------------------------------


def left_containers(state: GuardState, before: frozenset[str]) -> dict[str, str]:
    """Containers started since `before` that are still there once their owners had time to remove them."""
    deadline = time.monotonic() + CONTAINER_GONE_WAIT_SECONDS
    while True:
        left = {cid: name for cid, name in test_containers(state).items() if cid not in before}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(CONTAINER_POLL_SECONDS)


def end_processes(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + PROCESS_EXIT_WAIT_SECONDS
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                finished, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if finished:
                break
            time.sleep(0.05)


def check(item: pytest.Item, state: GuardState, before: Snapshot) -> list[str]:
    """What the test left behind, each as one line; what it left is removed."""
    problems: list[str] = []
    if uses_docker(item):
        containers = left_containers(state, before.containers)
        if containers:
            problems.append(f"containers still there: {sorted(containers.values())}")
            remove_containers(state, set(containers))
    children = {pid: comm for pid, comm in child_processes().items() if pid not in before.children}
    if children:
        problems.append(f"child processes still running: {sorted(children.items())}")
        end_processes(set(children))
    sockets = {inode: addr for inode, addr in listening_sockets().items() if inode not in before.listening}
    if sockets:
        problems.append(f"sockets still listening: {sorted(sockets.values())}")
    entries = temp_entries(state.temp_dir) - before.temp_entries
    if entries:
        problems.append(f"temporary files left in {state.temp_dir}: {sorted(entries)}")
        for name in entries:
            path = state.temp_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    return problems


# -- hooks -----------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    # Every temporary file of the run (the tests' and their subprocesses') goes here, so one left behind is
    # seen; the folder is short because tests make Unix sockets in it. pytest's own tmp_path folders stay
    # where they were (their paths hold Unix sockets too, and must not grow).
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_DIR_PREFIX))
    os.environ["TMPDIR"] = str(temp_dir)
    tempfile.tempdir = str(temp_dir)
    config.stash[STATE_KEY] = GuardState(temp_dir=temp_dir, docker_host=os.environ.get("DOCKER_HOST", DEFAULT_ENGINE))


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is not None:
        shutil.rmtree(state.temp_dir, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    # Once the fixtures are up: what they hold belongs to their scope, and each scope's teardown ends it.
    state = item.config.stash[STATE_KEY]
    state.baselines[item.nodeid] = snapshot(item, state)
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    # Outermost: runs once every fixture of the test (and of a scope that ends with it) is torn down.
    result = yield
    state = item.config.stash[STATE_KEY]
    before = state.baselines.pop(item.nodeid, None)
    if before is None:  # the setup failed: the test never ran
        return result
    problems = check(item, state, before)
    if problems:
        pytest.fail(f"{item.nodeid} left things behind:\n  " + "\n  ".join(problems), pytrace=False)
    return result
