"""What the tests against the real engine share: the label that marks their containers, and their removal."""

from __future__ import annotations

import docker

TEST_LABEL = "crewbot.test"


def remove_labelled(value: str) -> None:
    """Remove every container (running or not) whose TEST_LABEL is `value`."""
    client = docker.from_env()
    try:
        for container in client.containers.list(all=True, filters={"label": f"{TEST_LABEL}={value}"}):
            container.remove(force=True)
    finally:
        client.close()
