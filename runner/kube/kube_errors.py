"""What the Kubernetes backend can say before its client is imported: KubeConfigError, and whether the
official client (the optional `kubernetes` extra) is installed. Nothing here imports `kubernetes`, so an
install without the extra starts with SUBAGENT_RUNTIME=docker and explains itself with kubernetes."""

from __future__ import annotations

import importlib.util

CLIENT_MODULE = "kubernetes"
MISSING_EXTRA_CAUSE = "SUBAGENT_RUNTIME=kubernetes needs the kubernetes extra"
MISSING_EXTRA_FIX = "pip install 'crewbot[kubernetes]'"


class KubeConfigError(Exception):
    """The cluster's configuration cannot be loaded: `cause` and `fix`, shown as one line at start-up."""

    def __init__(self, cause: str, fix: str) -> None:
        super().__init__(f"{cause}: {fix}")
        self.cause = cause
        self.fix = fix


def require_client() -> None:
    """Raise KubeConfigError naming the extra when the official client is not installed."""
    if importlib.util.find_spec(CLIENT_MODULE) is None:
        raise KubeConfigError(MISSING_EXTRA_CAUSE, MISSING_EXTRA_FIX)
