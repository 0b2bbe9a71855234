"""The lifecycle rig's stand-in for a container's bind mounts: what the fast tests of the warm pool rely on."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from runner.lifecycle.container_spec import run_container_spec
from runner.lifecycle.pool_folders import make_member_folders
from tests.fakes.memory_runtime import MemoryContainer
from tests.harness import make_settings
from tests.runner.lifecycle_helpers import CHAT_ID, mounted_socket


def test_a_containers_run_socket_follows_its_channel_folder_renamed_by_a_claim(tmp_path: Path) -> None:
    member, run = tmp_path / "channels" / ".pool.member", tmp_path / "channels" / "run-1"
    listening = make_member_folders(member, tmp_path / "scratch")
    spec = run_container_spec(
        make_settings(tmp_path / "data"), run_id="m", chat_id=CHAT_ID, instance_id="i", workspace=tmp_path,
        channel_dir=member,
    )  # fmt: skip
    container = MemoryContainer("c", "c", {}, spec, 0.0)
    try:
        with mounted_socket(container) as path:
            os.rename(member, run)  # the claim, before the memory runtime's claim() is told
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as agent:
                agent.connect(str(path))  # the bind mount followed: no wait for a retry
            assert not (member / "run.sock").exists()
    finally:
        listening.close()
