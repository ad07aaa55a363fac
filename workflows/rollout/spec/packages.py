"""The packages of the rollout spec: what each installs (image, version, configMap), the interrupt it needs
after, what it depends on, and NodeWright's explicit uninstall.

Pure: stdlib + pydantic.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from workflows.rollout.spec.spec_fields import Duration, SpecModel

# semver.org 2.0.0, strict: no leading "v", no leading zeros.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
# NodeWright's webhook rule for package names.
PACKAGE_NAME = re.compile(r"^[a-z][-a-z0-9]{0,41}[a-z]$")
# An image repository path (no tag, no digest), as the distribution spec defines it.
_REPO_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_REGISTRY = re.compile(
    r"^(?:[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?)*(?::\d+)?$"
)
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_SERVICE = re.compile(r"^[-_.@a-zA-Z0-9:\\]+$")


InterruptType = Literal["reboot", "service", "restartAllServices", "noop"]


class Interrupt(SpecModel):
    """What a package needs after it is applied. Any interrupt means cordon → wait → drain first.

    `service` restarts `services` (daemon-reload first). `restartAllServices` is
    NodeWright's name for a sysctl reload (`service procps force-reload`); `services`
    may accompany it (the merged interrupt of a `service` and a `restartAllServices`
    package keeps the services). `reboot` and `noop` take no services.
    """

    type: InterruptType
    services: list[str] = Field(default_factory=list)

    @field_validator("services")
    @classmethod
    def _service_names(cls, value: list[str]) -> list[str]:
        for s in value:
            if not _SERVICE.match(s):
                raise ValueError(f"{s!r} is not a systemd unit name")
        return value

    @model_validator(mode="after")
    def _services_fit_type(self) -> Interrupt:
        if self.type == "service" and not self.services:
            raise ValueError("type 'service' needs at least one entry in services")
        if self.type in ("reboot", "noop") and self.services:
            raise ValueError(f"type {self.type!r} takes no services")
        return self


def _check_semver(value: str) -> str:
    if not _SEMVER.match(value):
        raise ValueError(f"{value!r} is not a semantic version (MAJOR.MINOR.PATCH[-PRERELEASE], e.g. 1.2.3)")
    if "+" in value:
        raise ValueError(f"{value!r}: build metadata ('+') cannot be part of an image tag")
    return value


def _check_image(value: str) -> str:
    if "@" in value:
        raise ValueError(f"{value!r}: give the image without a digest; pin bytes with containerSHA")
    parts = value.split("/")
    if ":" in parts[-1]:
        raise ValueError(f"{value!r}: give the image without a tag; the package version is the tag")
    registry = parts[0] if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost") else None
    repo = parts[1:] if registry else parts
    if registry is not None and not _REGISTRY.match(registry):
        raise ValueError(f"{value!r}: invalid registry {registry!r}")
    if not repo or not all(_REPO_COMPONENT.match(p) for p in repo):
        raise ValueError(f"{value!r} is not an image repository (lowercase registry/repo, no tag)")
    return value


class Uninstall(SpecModel):
    """NodeWright's explicit uninstall (v0.16+): `enabled` says the package may be uninstalled, `apply` does it now.

    With `apply`, the rollout runs the package's `uninstall` stage (the scripts of the version the node has), then
    `uninstall-interrupt` when the package has an interrupt, on every targeted node that has it, and takes it out
    of the node's packages annotation; it installs it nowhere.
    """

    enabled: bool = False
    apply: bool = False

    @model_validator(mode="after")
    def _apply_needs_enabled(self) -> Uninstall:
        if self.apply and not self.enabled:
            raise ValueError("apply: true needs enabled: true (NodeWright's rule)")
        return self


class Package(SpecModel):
    """One package: a container image whose scripts run on the host (NodeWright's Package)."""

    version: str = Field(description="Strict semver; also the image tag.")
    image: str = Field(min_length=1, max_length=255, description="Bare registry/repo, no tag or digest.")
    container_sha: str | None = Field(None, alias="containerSHA", description="sha256:<64 hex>; pins the image bytes.")
    interrupt: Interrupt | None = None
    config_map: dict[str, str] = Field(default_factory=dict, description="File name → content.")
    config_interrupts: dict[str, Interrupt] = Field(
        default_factory=dict, description="configMap key (or glob) → interrupt to run when that key changes."
    )
    depends_on: dict[str, str] = Field(default_factory=dict, description="Package name → version.")
    stage_timeout: Duration = Field(timedelta(hours=1), description="Bound on one attempt of each stage.")
    uninstall: Uninstall = Field(default_factory=Uninstall)

    _version = field_validator("version")(_check_semver)
    _image = field_validator("image")(_check_image)

    @field_validator("container_sha")
    @classmethod
    def _sha(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256.match(value):
            raise ValueError(f"{value!r} is not sha256:<64 lowercase hex digits>")
        return value

    @field_validator("config_map")
    @classmethod
    def _config_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _CONFIGMAP_KEY.match(key) or key in (".", "..") or len(key) > 253:
                raise ValueError(f"key {key!r} is not a file name (letters, digits, '-', '_', '.'; no '/')")
        return value

    @field_validator("config_interrupts")
    @classmethod
    def _config_interrupts_match(cls, value: dict[str, Interrupt], info: ValidationInfo) -> dict[str, Interrupt]:
        config_map = info.data.get("config_map")
        if config_map is None:  # configMap itself was invalid; that error is reported
            return value
        for pattern in value:
            if not any(fnmatch.fnmatchcase(key, pattern) for key in config_map):
                raise ValueError(f"key {pattern!r} matches no configMap key")
        return value

    @field_validator("depends_on")
    @classmethod
    def _dependency_versions(cls, value: dict[str, str]) -> dict[str, str]:
        for name, version in value.items():
            try:
                _check_semver(version)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
        return value

    @field_validator("stage_timeout")
    @classmethod
    def _finite_stage_timeout(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be a positive duration (Millwright has no unbounded stages)")
        return value

    def config_interrupt(self, changed_keys: Iterable[str]) -> list[Interrupt]:
        """The configInterrupts entries matching any changed configMap key (to be coalesced)."""
        keys = list(changed_keys)
        return [
            i
            for pattern, i in sorted(self.config_interrupts.items())
            if any(fnmatch.fnmatchcase(k, pattern) for k in keys)
        ]
