"""The host's side of hostile-subagent tests: the secrets beside DATA_DIR (a fake `.env`), canaries that must
not change, and what a host that copied or followed a container's entry would leave behind."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

LLM_KEY = "sk-llm-provider-key-7f3a9c"  # the provider key: only the proxy may hold it
# The operator's secret in a `.env` beside DATA_DIR. Kept in two halves so that no task, command or script a
# test sends ever contains it whole: finding it anywhere a run can see means the host leaked it.
SECRET_HALVES = ("ENV-SECRET-", "b81f2c6d0e")
SECRET = "".join(SECRET_HALVES)
KEY_HALVES = (LLM_KEY[:7], LLM_KEY[7:])


@dataclass(frozen=True)
class FileState:
    data: bytes
    mtime_ns: int
    mode: int
    nlink: int


def file_state(path: Path) -> FileState:
    st = path.lstat()
    return FileState(path.read_bytes(), st.st_mtime_ns, st.st_mode, st.st_nlink)


def plant_canaries(root: Path, data_dir: Path) -> dict[Path, FileState]:
    """A fake `.env` with the secret beside DATA_DIR and canaries inside it, dated in the past so that any
    rewrite shows as a new mtime."""
    files = {
        root / ".env": f"LLM_API_KEY={LLM_KEY}\nOPERATOR_SECRET={SECRET}\n",
        data_dir / "canary.txt": "canary in DATA_DIR\n",
        data_dir / "runs" / "canary-run" / "task.json": '{"canary": true}\n',
        data_dir / "sessions" / "canary.json": "[]\n",
    }
    long_ago = time.time() - 86_400
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o600)
        os.utime(path, (long_ago, long_ago))
    return {path: file_state(path) for path in files}


def odd_host_entries(data_dir: Path) -> list[str]:
    """Everything under DATA_DIR, outside the workspaces, that is not a plain directory or a regular file with
    one link: what a host that copied or followed a container's entry would leave behind."""
    odd: list[str] = []
    for root, dirs, files in os.walk(data_dir):
        if Path(root) == data_dir:
            dirs.remove("workspaces")
        for name in [*dirs, *files]:
            st = os.lstat(os.path.join(root, name))
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                odd.append(f"{os.path.join(root, name)} mode={oct(st.st_mode)} links={st.st_nlink}")
    return odd
