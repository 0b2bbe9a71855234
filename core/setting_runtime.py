"""Where subagents run: the backend (SUBAGENT_RUNTIME), a second kernel boundary (SUBAGENT_RUNTIME_CLASS) and
the Kubernetes backend's settings (KUBE_*). `Settings` takes these fields from `RuntimeSettings`.

Read once at start-up (the backend is built then); each is checked here with a line naming the variable,
and `crewbot doctor` checks that the backend answers and the runtime class starts a container.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field
from pydantic_settings import BaseSettings

# Kubernetes names: a DNS-1123 label (namespaces) and subdomain (RuntimeClass names); Docker runtime names
# (daemon.json keys) are taken to the same shape, so one value serves both backends.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DEFAULT_KUBE_JOB_TTL_SECONDS = 600
MAX_KUBE_JOB_TTL_SECONDS = 7 * 24 * 3600


class RuntimeKind(StrEnum):
    DOCKER = "docker"
    KUBERNETES = "kubernetes"


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


def _blank_is_none(value: object) -> object:
    return (value.strip() or None) if isinstance(value, str) else value


def _check_runtime_class(value: str | None) -> str | None:
    if value is not None and not DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError(
            "must be a runtime name as Docker's daemon.json and Kubernetes' RuntimeClass spell it "
            "(lower-case letters, digits, - and .), e.g. runsc or gvisor"
        )
    return value


def _check_namespace(value: str | None) -> str | None:
    if value is not None and not DNS_LABEL.fullmatch(value):
        raise ValueError(
            "must be a Kubernetes namespace name (up to 63 lower-case letters, digits and -), e.g. crewbot"
        )
    return value


def _pull_policy(value: object) -> object:
    """Kubernetes spells them in CamelCase; an operator may not: `ifnotpresent` is taken too."""
    if isinstance(value, str):
        for policy in PullPolicy:
            if value.strip().lower() == policy.value.lower():
                return policy
    return value


RuntimeClassName = Annotated[str | None, BeforeValidator(_blank_is_none), AfterValidator(_check_runtime_class)]
Namespace = Annotated[str | None, BeforeValidator(_blank_is_none), AfterValidator(_check_namespace)]
KubeconfigPath = Annotated[Path | None, BeforeValidator(_blank_is_none)]


class RuntimeSettings(BaseSettings):
    subagent_runtime: RuntimeKind = Field(default=RuntimeKind.DOCKER, alias="SUBAGENT_RUNTIME")
    # Docker's --runtime (e.g. runsc) or Kubernetes' runtimeClassName (e.g. gvisor); empty: the engine's default.
    subagent_runtime_class: RuntimeClassName = Field(default=None, alias="SUBAGENT_RUNTIME_CLASS")
    # Empty: the bot's own namespace when it runs in the cluster, else `default`.
    kube_namespace: Namespace = Field(default=None, alias="KUBE_NAMESPACE")
    # Empty: the in-cluster service account when the bot runs in a pod, else ~/.kube/config.
    kubeconfig: KubeconfigPath = Field(default=None, alias="KUBECONFIG")
    kube_image_pull_policy: Annotated[PullPolicy, BeforeValidator(_pull_policy)] = Field(
        default=PullPolicy.IF_NOT_PRESENT, alias="KUBE_IMAGE_PULL_POLICY"
    )
    # A finished Job is deleted by crewbot once its outcome is recorded; the TTL covers a bot that died first.
    kube_job_ttl_seconds: int = Field(
        default=DEFAULT_KUBE_JOB_TTL_SECONDS, ge=0, le=MAX_KUBE_JOB_TTL_SECONDS, alias="KUBE_JOB_TTL_SECONDS"
    )
