"""The tools baked into the subagent image: SUBAGENT_IMAGE_PACKAGES (pip) and SUBAGENT_IMAGE_APT (Debian).

Both lists are checked where they are read (core/setting_lists.py refuses URLs, paths, options and shell
metacharacters). Here: the lists as the image build sees them, the key that names one set of tools on one
base, and the labels through which an image says which tools, at which versions, it holds.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode

from core.setting_lists import apt_packages, pip_requirements
from core.settings import Settings

PIP_SETTING = "SUBAGENT_IMAGE_PACKAGES"
APT_SETTING = "SUBAGENT_IMAGE_APT"
# On the tools image and inherited by the image built on it: which key, and what was installed (JSON).
LABEL_TOOLS_KEY = "crewbot.image.tools.key"
LABEL_PIP = "crewbot.image.tools.pip"
LABEL_APT = "crewbot.image.tools.apt"
# Changing how tools are fetched or installed changes every key, so no old tools image is reused.
# 2: the venv's bin folder comes first on the image's PATH.
TOOLS_FORMAT = 2
SPEC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SETTINGS_FIX = "correct it in .env or the environment"


class ToolsError(Exception):
    """Tools could not be read, fetched or installed; the message is one line naming what and why."""


@dataclass(frozen=True, slots=True)
class ImageTools:
    """The pip requirements and Debian packages to bake in, sorted and without repeats."""

    pip: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()

    @classmethod
    def of(cls, pip: list[str] | tuple[str, ...] = (), apt: list[str] | tuple[str, ...] = ()) -> ImageTools:
        """From lists as the settings hold them, checked again (nothing reaches a command unchecked)."""
        return cls(pip=tuple(sorted(set(pip_requirements(list(pip))))), apt=tuple(sorted(set(apt_packages(list(apt))))))

    def __bool__(self) -> bool:
        return bool(self.pip or self.apt)

    def hash_text(self) -> str:
        """What the image's content hash adds for these tools: nothing when there are none."""
        if not self:
            return ""
        return f"tools={TOOLS_FORMAT}\npip={' '.join(self.pip)}\napt={' '.join(self.apt)}\n"

    def key(self, base_image_id: str) -> str:
        """Names these tools on this exact base: the tools image's tag and the download cache's folder."""
        return hashlib.sha256(f"base={base_image_id}\n{self.hash_text()}".encode()).hexdigest()

    def pip_names(self) -> list[str]:
        """The distributions the requirements name, in pip's normal form (`Pandas[all]>=2` gives `pandas`)."""
        return [canonical_name(spec) for spec in self.pip]

    def summary(self) -> str:
        parts = [f"pip {' '.join(self.pip)}" if self.pip else "", f"apt {' '.join(self.apt)}" if self.apt else ""]
        return "; ".join(part for part in parts if part)


class _ToolSettings(BaseSettings):
    """Only the two settings the image build reads: an unrelated bad setting must not stop a build."""

    model_config = Settings.model_config
    pip: Annotated[list[str], NoDecode] = Field(default_factory=list, alias="SUBAGENT_IMAGE_PACKAGES")
    apt: Annotated[list[str], NoDecode] = Field(default_factory=list, alias="SUBAGENT_IMAGE_APT")

    @field_validator("pip", mode="before")
    @classmethod
    def _parse_pip(cls, value: object) -> object:
        return pip_requirements(value)

    @field_validator("apt", mode="before")
    @classmethod
    def _parse_apt(cls, value: object) -> object:
        return apt_packages(value)


def tools_from_settings() -> ImageTools:
    """SUBAGENT_IMAGE_PACKAGES and SUBAGENT_IMAGE_APT from the environment and .env, as the bot reads them."""
    try:
        read = _ToolSettings()
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else PIP_SETTING
        setting = APT_SETTING if name in ("apt", APT_SETTING) else PIP_SETTING
        message = error["msg"].removeprefix("Value error, ")
        raise ToolsError(f"invalid setting {setting}: {message}; {SETTINGS_FIX}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolsError(f"cannot read the .env file: {exc}") from None
    return ImageTools.of(read.pip, read.apt)


def canonical_name(spec: str) -> str:
    """PEP 503's normal form of the name a requirement starts with."""
    found = SPEC_NAME.match(spec)
    name = found.group(0) if found else spec
    return re.sub(r"[-_.]+", "-", name).lower()


def tool_labels(key: str, pip_versions: Mapping[str, str], apt_versions: Mapping[str, str]) -> dict[str, str]:
    """The labels of a tools image (its key, and the requested tools with their installed versions)."""
    return {
        LABEL_TOOLS_KEY: key,
        LABEL_PIP: json.dumps(dict(pip_versions), separators=(",", ":")),
        LABEL_APT: json.dumps(dict(apt_versions), separators=(",", ":")),
    }


def installed_tools(labels: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The pip and Debian packages (name to version) an image's labels say it holds; ({}, {}) if none."""
    return _versions(labels.get(LABEL_PIP)), _versions(labels.get(LABEL_APT))


def describe_tools(labels: Mapping[str, str]) -> str:
    """`tools: pandas 2.2.3, matplotlib 3.9.2; apt: poppler-utils 22.12.0-2`, or `no extra tools`."""
    pip_versions, apt_versions = installed_tools(labels)
    parts = []
    if pip_versions:
        parts.append("tools: " + ", ".join(f"{name} {version}" for name, version in pip_versions.items()))
    if apt_versions:
        parts.append("apt: " + ", ".join(f"{name} {version}" for name, version in apt_versions.items()))
    return "; ".join(parts) or "no extra tools"


def _versions(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {str(name): str(version) for name, version in parsed.items()}
