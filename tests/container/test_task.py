"""The task as the container reads it: the host's TaskSpec JSON, the file and egress fields included, and an
older host's task without them (defaults)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from container.protocol import EgressOffer, TaskSpec
from container.protocol import OfferedFile as HostOfferedFile
from container.task import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_FILES_OUT, Egress, OfferedFile, Task, TaskInvalid

BASE: dict[str, Any] = {"run_id": "run-task01", "task": "t", "label": "l"}


def test_the_hosts_file_fields_arrive() -> None:
    spec = TaskSpec(
        **BASE,
        files=[
            HostOfferedFile(index=0, name="sales.csv", size_bytes=412, mime_type="text/csv"),
            HostOfferedFile(index=1, name="blob", size_bytes=0),
        ],
        file_notes=["f9 was not given: too large"],
        max_file_bytes=1_000,
        max_files_out=2,
    )

    task = Task.from_json(spec.model_dump_json().encode())

    assert task.files == [OfferedFile(0, "sales.csv", 412, "text/csv"), OfferedFile(1, "blob", 0, None)]
    assert (task.file_notes, task.max_file_bytes, task.max_files_out) == (["f9 was not given: too large"], 1_000, 2)


@pytest.mark.parametrize(
    ("offer", "expected"),
    [
        (None, None),
        (
            EgressOffer(mode="allowlist", allow=["pypi.org", "*.github.com:443"], max_bytes=50 * 1024 * 1024),
            Egress("allowlist", ["pypi.org", "*.github.com:443"], 50 * 1024 * 1024),
        ),
        (EgressOffer(mode="open", max_bytes=0), Egress("open", [], 0)),
    ],
)
def test_the_hosts_egress_offer_arrives(offer: EgressOffer | None, expected: Egress | None) -> None:
    spec = TaskSpec(**BASE, egress=offer)

    assert Task.from_json(spec.model_dump_json().encode()).egress == expected


def test_an_older_hosts_task_gets_the_defaults() -> None:
    task = Task.from_json(json.dumps(BASE).encode())

    assert (task.files, task.file_notes, task.egress) == ([], [], None)
    assert (task.max_file_bytes, task.max_files_out) == (DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_FILES_OUT)
    host_defaults = TaskSpec(**BASE)  # an older host's task is read as the host's own defaults
    assert (host_defaults.max_file_bytes, host_defaults.max_files_out) == (
        DEFAULT_MAX_FILE_BYTES,
        DEFAULT_MAX_FILES_OUT,
    )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"files": {"0": "x"}}, "the task's files is not a list"),
        ({"files": ["sales.csv"]}, "the task's files hold a value that is not an object"),
        ({"files": [{"index": 0, "name": "a", "size_bytes": -1}]}, "the task's files hold a negative size"),
        ({"files": [{"index": "0", "name": "a", "size_bytes": 1}]}, "an offered file's index is not a int"),
        ({"files": [{"index": 0, "size_bytes": 1}]}, "an offered file has no name"),
        ({"max_file_bytes": "20 MB"}, "the task's max_file_bytes is not a int"),
        ({"max_files_out": True}, "the task's max_files_out is not a int"),
        ({"egress": "open"}, "the task's egress is not an object"),
        ({"egress": {"mode": "none", "max_bytes": 1}}, "the task's egress mode is not one of allowlist, ask, open"),
        ({"egress": {"mode": "open"}}, "the task's egress has no max_bytes"),
        ({"egress": {"mode": "open", "max_bytes": -1}}, "the task's egress max_bytes is negative"),
        ({"egress": {"mode": "open", "max_bytes": 1.5}}, "the task's egress's max_bytes is not a int"),
        (
            {"egress": {"mode": "allowlist", "allow": "pypi.org", "max_bytes": 1}},
            "the task's egress's allow is not a list",
        ),
        (
            {"egress": {"mode": "allowlist", "allow": ["pypi.org", 443], "max_bytes": 1}},
            "the task's egress allow holds a value that is not a string",
        ),
    ],
)
def test_unusable_file_fields_are_refused_with_the_field(fields: dict[str, Any], reason: str) -> None:
    with pytest.raises(TaskInvalid) as refused:
        Task.from_json(json.dumps(BASE | fields).encode())
    assert str(refused.value) == reason
