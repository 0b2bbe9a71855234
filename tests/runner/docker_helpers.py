"""What the tests against the real engine share: the label that marks their containers, and their removal."""

from __future__ import annotations

import contextlib

import docker
from docker.errors import DockerException, NotFound

from runner.runtimes.runtime import LABEL_INSTANCE

TEST_LABEL = "crewbot.test"


def remove_labelled(value: str, label: str = TEST_LABEL) -> None:
    """Remove every container (running or not) whose `label` is `value`."""
    client = docker.from_env()
    try:
        for container in client.containers.list(all=True, sparse=True, filters={"label": f"{label}={value}"}):
            with contextlib.suppress(NotFound):  # removed by its owner meanwhile
                container.remove(force=True)
    finally:
        client.close()


def remove_instance_containers(instance_id: str) -> None:
    """Remove every subagent container of one app instance (its data dir): what a test's app started.
    The product leaves running containers at stop for the next start to re-attach; a test has no next start.
    A test whose DOCKER_HOST leads to no engine started none (the suite's leak guard checks the real one)."""
    try:
        remove_labelled(instance_id, LABEL_INSTANCE)
    except DockerException as exc:
        if "Error while fetching server API version" not in str(exc):
            raise
