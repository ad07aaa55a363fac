"""The Ironic activities' inputs and results, and the provision states they read.

Pydantic models only: workflows/burnin/server_burnin.py imports them.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from activities.ironic.steps import CleanStep
from activities.models import StrictModel

# Provision states (Ironic's ironic/common/states.py).
MANAGEABLE = "manageable"
CLEANING = "cleaning"
CLEAN_WAIT = "clean wait"
CLEAN_FAILED = "clean failed"
CLEAN_HOLD = "clean hold"
CLEANING_STATES = frozenset({CLEANING, CLEAN_WAIT, CLEAN_HOLD})
# States Ironic leaves by itself: a node in one of them is on its way somewhere.
TRANSIENT_STATES = frozenset({
    "verifying", CLEANING, CLEAN_WAIT, "inspecting", "inspect wait", "deploying", "wait call-back", "deleting",
    "adopting", "rescuing", "rescue wait", "unrescuing", "servicing", "service wait", "unservicing",
})  # fmt: skip

_NODE_IDENT = re.compile(r"^[^/\s]{1,255}$")


def _node_ident(value: str) -> str:
    value = value.strip() if isinstance(value, str) else value
    if not isinstance(value, str) or not _NODE_IDENT.match(value):
        raise ValueError(f"{value!r} is not an Ironic node name or UUID (1-255 characters, no '/' or spaces)")
    return value


class NodeRef(StrictModel):
    node: str = Field(description="Ironic node name or UUID.")
    _n = field_validator("node")(_node_ident)


class IronicNode(StrictModel):
    uuid: str
    name: str | None = None
    provision_state: str
    target_provision_state: str | None = None
    power_state: str | None = None
    maintenance: bool = False
    last_error: str | None = None
    clean_step: dict[str, Any] = Field(default_factory=dict, description="The step running now; {} between steps.")

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> IronicNode:
        return cls(
            uuid=body["uuid"], name=body.get("name"), provision_state=body.get("provision_state") or "",
            target_provision_state=body.get("target_provision_state"), power_state=body.get("power_state"),
            maintenance=bool(body.get("maintenance")), last_error=body.get("last_error") or None,
            clean_step=body.get("clean_step") or {},
        )  # fmt: skip


class DriverInfoUpdate(NodeRef):
    """driver_info keys to set; a value of None removes the key."""

    values: dict[str, Any] = Field(min_length=1)

    @field_validator("values")
    @classmethod
    def _keys(cls, values: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k in values if not k or not k.strip()]
        if bad:
            raise ValueError("driver_info keys must be non-empty")
        return values


class DriverInfoResult(StrictModel):
    node: str = Field(description="The node's UUID.")
    changed: list[str] = Field(default_factory=list, description="Keys this attempt set or removed.")
    unchanged: list[str] = Field(default_factory=list, description="Keys that already had the value.")


class ManageRequest(NodeRef):
    timeout_seconds: float = Field(600.0, gt=0)
    poll_seconds: float | None = Field(None, gt=0, description="Default: the worker's IronicConfig.poll_seconds.")


class ManageResult(StrictModel):
    node: IronicNode
    changed: bool = Field(description="False when the node was already manageable (or on its way there).")


class StartClean(NodeRef):
    steps: list[CleanStep] = Field(min_length=1)
    disable_ramdisk: bool | None = Field(None, description="Run the steps without booting IPA (Ironic >= 1.70).")


class CleanStarted(StrictModel):
    node: IronicNode
    started: bool = Field(description="True when this attempt asked Ironic to clean.")
    already: Literal["running", "finished"] | None = Field(
        None, description="A retry found these steps already cleaning, or already run since the activity was scheduled."
    )


class WaitClean(NodeRef):
    timeout_seconds: float = Field(gt=0, description="How long the clean may take in all.")
    poll_seconds: float | None = Field(None, gt=0, description="Default: the worker's IronicConfig.poll_seconds.")


class CleanResult(StrictModel):
    node: IronicNode
    waited_seconds: float
