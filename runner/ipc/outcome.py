"""What a spawn-request handler tells the IPC watcher."""

from enum import StrEnum


class RequestOutcome(StrEnum):
    ACCEPTED = "accepted"  # recorded (queued, rejected or cancelled): delete the file
    DUPLICATE = "duplicate"  # this request id was processed before: quarantine the file with that reason
