"""Where the agent finds its run dir, IPC folder and workspace: the image's mount points, or env overrides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from container.protocol import (
    IPC_DIR,
    LLM_SOCKET_FILE,
    RESULT_FILE,
    RUN_DIR,
    SESSION_IN_FILE,
    SESSION_OUT_FILE,
    TASK_FILE,
    WORKSPACE_DIR,
)

RUN_DIR_ENV = "CREWBOT_RUN_DIR"
IPC_DIR_ENV = "CREWBOT_IPC_DIR"
WORKSPACE_DIR_ENV = "CREWBOT_WORKSPACE_DIR"


@dataclass(frozen=True, slots=True)
class ContainerPaths:
    run_dir: Path
    ipc_dir: Path
    workspace_dir: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ContainerPaths:
        """The mount points, unless the environment names other folders (tests run the agent on the host)."""
        return cls(
            run_dir=Path(environ.get(RUN_DIR_ENV) or RUN_DIR),
            ipc_dir=Path(environ.get(IPC_DIR_ENV) or IPC_DIR),
            workspace_dir=Path(environ.get(WORKSPACE_DIR_ENV) or WORKSPACE_DIR),
        )

    @property
    def task_file(self) -> Path:
        return self.run_dir / TASK_FILE

    @property
    def result_file(self) -> Path:
        return self.run_dir / RESULT_FILE

    @property
    def session_in_file(self) -> Path:
        return self.run_dir / SESSION_IN_FILE

    @property
    def session_out_file(self) -> Path:
        return self.run_dir / SESSION_OUT_FILE

    @property
    def llm_socket(self) -> Path:
        return self.run_dir / LLM_SOCKET_FILE
