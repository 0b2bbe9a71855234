"""Which cluster and namespace the Job runtime talks to: KUBECONFIG, else the pod's service account, else
~/.kube/config; KUBE_NAMESPACE, else the service account's or the kubeconfig context's namespace, else
`default`. Loaded once at start-up by the official client's own loaders; a failure is one line that names
the setting and what to do."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from core.settings import Settings
from runner.kube.kube_errors import KubeConfigError

SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"  # set by the kubelet in every pod
DEFAULT_NAMESPACE = "default"
MAX_NAMESPACE_FILE_BYTES = 256


@dataclass(frozen=True, slots=True)
class KubeTarget:
    api: client.ApiClient
    namespace: str
    source: str  # where the configuration came from, for doctor and the logs
    # The client writes a kubeconfig's embedded certificate and key to files: in this private folder, removed
    # by close() (the client's own loader leaves them in /tmp for good).
    scratch: Path | None = None

    @property
    def server(self) -> str:
        return str(self.api.configuration.host)

    def close(self) -> None:
        self.api.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def _context_namespace(path: str | None) -> str | None:
    try:
        _, active = config.list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError, TypeError, ValueError):
        return None
    namespace = (active or {}).get("context", {}).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else None


def load_target(settings: Settings) -> KubeTarget:
    """Blocking (reads files): call it at start-up, or in a thread."""
    configuration = client.Configuration()
    namespace = settings.kube_namespace
    scratch = Path(tempfile.mkdtemp(prefix="crewbot-kube-"))  # 0700, this process's own
    try:
        if settings.kubeconfig is not None:
            path = str(settings.kubeconfig)
            config.load_kube_config(
                config_file=path, client_configuration=configuration, persist_config=False, temp_file_path=str(scratch)
            )
            source = f"KUBECONFIG={path}"
            namespace = namespace or _context_namespace(path)
        elif os.environ.get(IN_CLUSTER_ENV):
            config.load_incluster_config(client_configuration=configuration)
            source = "the pod's service account"
            if namespace is None and SERVICE_ACCOUNT_NAMESPACE_FILE.is_file():
                namespace = SERVICE_ACCOUNT_NAMESPACE_FILE.read_text()[:MAX_NAMESPACE_FILE_BYTES].strip() or None
        else:
            config.load_kube_config(
                client_configuration=configuration, persist_config=False, temp_file_path=str(scratch)
            )
            source = "~/.kube/config"
            namespace = namespace or _context_namespace(None)
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch)
        where = f"KUBECONFIG={settings.kubeconfig}" if settings.kubeconfig else "no KUBECONFIG, not in a pod"
        raise KubeConfigError(
            f"SUBAGENT_RUNTIME=kubernetes: cannot load the cluster's configuration ({where}): {exc}",
            "set KUBECONFIG to a kubeconfig file, or run the bot in the cluster (deploy/kubernetes/)",
        ) from exc
    return KubeTarget(client.ApiClient(configuration), namespace or DEFAULT_NAMESPACE, source, scratch)
