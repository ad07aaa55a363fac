"""The Fabric entity's state and requests: what IsolateTenant, ReleaseTenant and FabricAudit read and send it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from activities.models import StrictModel
from activities.ufm.models import normalize_pkey
from workflows.common.base import WorkflowInput
from workflows.fabric.calls import validate_fabric_name

HISTORY_LIMIT = 2000  # the Fabric entity continues as new past this many events


class Allocation(StrictModel):
    tenant: str
    pkey: str
    members: dict[str, str] = Field(default_factory=dict, description="Desired members: port GUID -> host.")
    membership: Literal["full", "limited"] = "full"
    state: Literal["allocated", "isolated", "releasing"] = "allocated"


class FabricState(StrictModel):
    allocations: dict[str, Allocation] = Field(default_factory=dict, description="By tenant.")
    retired: dict[str, str] = Field(default_factory=dict, description="PKeys never handed out again, and why.")
    changes: int = 0


class FabricInput(WorkflowInput):
    fabric: str
    pkey_first: str = Field("0x100", description="Lowest PKey this fabric hands out.")
    pkey_last: str = Field("0x7ffe", description="Highest PKey this fabric hands out.")
    history_limit: int = Field(HISTORY_LIMIT, ge=50, description="Continue-as-new past this many history events.")
    state: FabricState = Field(default_factory=FabricState, description="Carried across continue-as-new.")

    _n = field_validator("fabric")(validate_fabric_name)
    _p = field_validator("pkey_first", "pkey_last")(normalize_pkey)

    def workflow_id(self) -> str:
        return f"fabric/{self.fabric}"


class AllocateRequest(StrictModel):
    tenant: str
    members: dict[str, str] = Field(description="Port GUID -> host: the tenant's desired members.")
    membership: Literal["full", "limited"] = "full"
    exclude: list[str] = Field(default_factory=list, description="PKeys in use in UFM outside this fabric's books.")


class TenantRequest(StrictModel):
    tenant: str


class WithdrawRequest(StrictModel):
    tenant: str
    guids: list[str] = Field(description="Port GUIDs no longer desired (a failed isolation's additions).")


class FinishRelease(StrictModel):
    tenant: str
    remaining: dict[str, str] = Field(default_factory=dict, description="Members left in the PKey: retire it.")
