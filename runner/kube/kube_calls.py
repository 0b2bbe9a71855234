"""The Kubernetes API calls the Job runtime makes, synchronous (the official client), as plain views.

Everything the runtime needs from the cluster in a dozen calls over one namespace, each turning the client's
models into small frozen views and its errors into ours: 404 is "gone" (None or a no-op), an unreachable API
server is RuntimeUnavailable, any other refusal names the call and the server's reason. The runtime calls these
in its own threads; an in-memory twin (tests/fakes/memory_kube.py) takes their place in the fast tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import urllib3.exceptions
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from runner.runtimes.runtime import RuntimeUnavailable

CONTAINER_NAME = "agent"  # the one container of a run's pod
JOB_NAME_LABEL = "job-name"  # set by the Job controller on the pods it makes
HTTP_BAD_REQUEST = 400
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_GONE = 410
LOG_LIMIT_BYTES = 1024 * 1024  # the tail of a run's output that is kept; the store trims further
REQUEST_TIMEOUT_SECONDS = 30.0


# What the runtime and the bridge ask of the API server: (API group, resource, verbs). deploy/kubernetes/rbac.yaml
# grants exactly these (tests/runner/kube/test_kube_deploy.py holds them to it) and doctor checks each.
PERMISSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("batch", "jobs", ("create", "get", "list", "watch", "delete")),
    ("", "pods", ("get", "list", "watch", "delete")),
    ("", "pods/log", ("get",)),
    ("", "pods/exec", ("create", "get")),
    ("", "events", ("list",)),  # why a Job's controller could not make its pod (a runtime class, a quota)
)


class KubeRefused(Exception):
    """The API server answered with a refusal other than "not found"; the message names the call and reason."""


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    uid: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    node_name: str | None
    container_id: str | None  # the runtime's id (containerd://...), once created
    started_at: float | None  # unix seconds the container started
    exit_code: int | None  # once it terminated
    waiting_reason: str | None  # ContainerCreating, ErrImageNeverPull, ...
    waiting_message: str | None
    deleting: bool  # a deletion was asked for
    ended_why: str | None = None  # the pod's own reason and message (Evicted: ...), when the kubelet gives one
    image: str | None = None  # the image its spec names
    image_id: str | None = None  # the image the node runs for it (its digest), once the container exists


@dataclass(frozen=True, slots=True)
class JobView:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    failed_reason: str | None  # the Job's Failed condition: DeadlineExceeded, BackoffLimitExceeded
    complete: bool
    created_at: float | None


def _seconds(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def pod_view(pod: Any) -> PodView:
    status = pod.status
    statuses = [s for s in (status.container_statuses or []) if s.name == CONTAINER_NAME]
    state = statuses[0].state if statuses else None
    terminated = state.terminated if state is not None else None
    running = state.running if state is not None else None
    waiting = state.waiting if state is not None else None
    started = (running.started_at if running else None) or (terminated.started_at if terminated else None)
    return PodView(
        name=pod.metadata.name,
        uid=pod.metadata.uid,
        phase=status.phase or "Unknown",
        node_name=pod.spec.node_name,
        container_id=statuses[0].container_id if statuses else None,
        started_at=_seconds(started),
        exit_code=terminated.exit_code if terminated is not None else None,
        waiting_reason=waiting.reason if waiting is not None else None,
        waiting_message=waiting.message if waiting is not None else None,
        deleting=pod.metadata.deletion_timestamp is not None,
        ended_why=": ".join(part for part in (status.reason, status.message) if part) or None,
        image=next((c.image for c in pod.spec.containers or [] if c.name == CONTAINER_NAME), None),
        image_id=(statuses[0].image_id or None) if statuses else None,
    )


def job_view(job: Any) -> JobView:
    conditions = (job.status.conditions if job.status else None) or []
    failed = next((c.reason or "Failed" for c in conditions if c.type == "Failed" and c.status == "True"), None)
    complete = any(c.type == "Complete" and c.status == "True" for c in conditions)
    return JobView(
        name=job.metadata.name,
        labels=dict(job.metadata.labels or {}),
        annotations=dict(job.metadata.annotations or {}),
        failed_reason=failed,
        complete=complete,
        created_at=_seconds(job.metadata.creation_timestamp),
    )


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


class KubeCalls:
    """One namespace of one cluster, through an `ApiClient` built by runner/kube/kube_config.py."""

    def __init__(self, api: client.ApiClient, namespace: str, on_close: Callable[[], None] | None = None) -> None:
        self.namespace = namespace
        self._api = api
        self._on_close = on_close or api.close  # the target's close: the client and its certificate files
        self._core = client.CoreV1Api(api)
        self._batch = client.BatchV1Api(api)
        self._server = api.configuration.host

    def _unavailable(self, exc: BaseException) -> RuntimeUnavailable:
        return RuntimeUnavailable(f"Kubernetes API server not reachable at {self._server}: {exc}")

    def _refused(self, what: str, exc: ApiException) -> Exception:
        if exc.status in (401, 403):
            return KubeRefused(
                f"{what}: the API server refused ({exc.status}): {_reason(exc)}; the bot's account needs the Role "
                f"in deploy/kubernetes/rbac.yaml in namespace {self.namespace}"
            )
        return KubeRefused(f"{what}: {exc.status} {_reason(exc)}")

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One API call; None when the object is not found."""
        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT_SECONDS, **kwargs)
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            if exc.status == 0 or exc.status is None:
                raise self._unavailable(exc) from exc
            raise self._refused(what, exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._unavailable(exc) from exc

    def missing_permissions(self) -> list[str]:
        """Which of PERMISSIONS this account lacks in the namespace, as `verb resource` (SelfSubjectAccessReview,
        which every authenticated account may ask)."""
        reviews = client.AuthorizationV1Api(self._api)
        missing: list[str] = []
        for group, resource, verbs in PERMISSIONS:
            name, _, subresource = resource.partition("/")
            for verb in verbs:
                attributes = {"namespace": self.namespace, "verb": verb, "group": group, "resource": name}
                if subresource:
                    attributes["subresource"] = subresource
                body: Any = {"spec": {"resourceAttributes": attributes}}
                review = self._call("review access", reviews.create_self_subject_access_review, body)
                if review is None or not review.status.allowed:
                    missing.append(f"{verb} {resource}")
        return missing

    def ping(self) -> None:
        """The namespace's Jobs can be listed: the server answers and the account may do what runs need."""
        self._call("list jobs", self._batch.list_namespaced_job, self.namespace, limit=1)

    def create_job(self, body: dict[str, Any]) -> bool:
        """False when a Job of that name exists already."""
        try:
            # A plain dict body is sent as it is (the client serialises models and dicts alike).
            job: Any = body
            self._batch.create_namespaced_job(self.namespace, job, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except ApiException as exc:
            if exc.status == HTTP_CONFLICT:
                return False
            if exc.status in (0, None):
                raise self._unavailable(exc) from exc
            raise self._refused(f"create job {body['metadata']['name']}", exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._unavailable(exc) from exc
        return True

    def read_job(self, name: str) -> JobView | None:
        job = self._call(f"read job {name}", self._batch.read_namespaced_job, name, self.namespace)
        return job_view(job) if job is not None else None

    def list_jobs(self, selector: str) -> list[JobView]:
        jobs = self._call("list jobs", self._batch.list_namespaced_job, self.namespace, label_selector=selector)
        return [job_view(job) for job in (jobs.items if jobs is not None else [])]

    def delete_job(self, name: str) -> None:
        """Its pods go with it (background); gone already is fine."""
        self._unread(
            self._call(
                f"delete job {name}",
                self._batch.delete_namespaced_job,
                name,
                self.namespace,
                propagation_policy="Background",
                _preload_content=False,
            )
        )

    @staticmethod
    def _unread(response: Any) -> None:
        """A delete's answer is the object as it was: read (so its connection goes back to the pool) and dropped
        unparsed. A kill's two deletes are then two requests, not two objects made of JSON on a loaded host."""
        if response is not None:
            _ = response.data
            response.release_conn()

    def job_pods(self, job_name: str) -> tuple[list[PodView], str]:
        """The job's pods and the list's resourceVersion (a watch from it sees only later changes)."""
        pods = self._call(
            f"list pods of job {job_name}",
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{JOB_NAME_LABEL}={job_name}",
        )
        if pods is None:
            return [], ""
        return [pod_view(pod) for pod in pods.items], str(pods.metadata.resource_version or "")

    def pod_refusal(self, job_name: str) -> str | None:
        """Why the Job's controller could not create its pod (its latest FailedCreate event), if it could not."""
        events = self._call(
            f"list events of job {job_name}",
            self._core.list_namespaced_event,
            self.namespace,
            field_selector=f"involvedObject.kind=Job,involvedObject.name={job_name}",
        )
        failed = [e for e in (events.items if events is not None else []) if e.reason == "FailedCreate"]
        return str(failed[-1].message or "FailedCreate") if failed else None

    def delete_pod_now(self, name: str) -> None:
        """Grace 0: the API object goes at once and the kubelet kills the container (SIGKILL after its minimum)."""
        self._unread(
            self._call(
                f"delete pod {name}",
                self._core.delete_namespaced_pod,
                name,
                self.namespace,
                grace_period_seconds=0,
                _preload_content=False,
            )
        )

    def pod_log(self, name: str) -> bytes:
        """Its output so far; empty when its container has none to give (not started yet, or removed with an
        evicted pod: the server answers 400 then)."""
        try:
            return self._pod_log(name)
        except KubeRefused as exc:
            if f": {HTTP_BAD_REQUEST} " in str(exc):
                return b""
            raise

    def _pod_log(self, name: str) -> bytes:
        text = self._call(
            f"read log of pod {name}",
            self._core.read_namespaced_pod_log,
            name,
            self.namespace,
            container=CONTAINER_NAME,
            limit_bytes=LOG_LIMIT_BYTES,
            _preload_content=False,
        )
        return bytes(text.data) if text is not None else b""

    def watch_job_pods(self, job_name: str, timeout_seconds: int, since: str) -> Iterator[PodView]:
        """Each change to the job's pods after resourceVersion `since`, for up to `timeout_seconds` (the server
        ends the watch then). An expired version ends it at once: the caller lists again."""
        stream = watch.Watch().stream(
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{JOB_NAME_LABEL}={job_name}",
            resource_version=since or None,
            timeout_seconds=timeout_seconds,
            _request_timeout=timeout_seconds + REQUEST_TIMEOUT_SECONDS,
        )
        try:
            for event in stream:
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    yield pod_view(event["object"])
                else:  # ERROR: the version expired (410); BOOKMARK never asked for
                    return
        except ApiException as exc:
            if exc.status == HTTP_GONE:
                return
            if exc.status in (0, None):
                raise self._unavailable(exc) from exc
            raise self._refused(f"watch pods of job {job_name}", exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._unavailable(exc) from exc

    def close(self) -> None:
        self._on_close()
