"""The Fabric entity's state and requests: what IsolateTenant, ReleaseTenant and FabricAudit read and send it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from activities.models import StrictModel
from activities.ufm.models import MANAGEMENT_PKEY, FabricSnapshot, normalize_pkey
from workflows.common.base import WorkflowInput
from workflows.fabric.calls import validate_fabric_name

HISTORY_LIMIT = 2000  # the Fabric entity continues as new past this many events


class Allocation(StrictModel):
    tenant: str
    pkey: str
    members: dict[str, str] = Field(default_factory=dict, description="Desired members: port GUID -> host.")
    membership: Literal["full", "limited"] = "full"
    state: Literal["allocated", "isolated", "releasing"] = "allocated"

    _p = field_validator("pkey")(normalize_pkey)  # never the management key 0x7fff (or 0xffff, its full form)


class FabricState(StrictModel):
    allocations: dict[str, Allocation] = Field(default_factory=dict, description="By tenant.")
    retired: dict[str, str] = Field(default_factory=dict, description="PKeys never handed out again, and why.")
    changes: int = 0

    def ports_of_others(self, tenant: str, members: dict[str, str], snap: FabricSnapshot) -> list[str]:
        """The tenant's ports (GUID -> host) that UFM already has in another PKey than the tenant's own (the
        management key aside), each with its host, the PKey and whose it is: a port belongs to one partition."""
        held = self.allocations.get(tenant)
        whose = {a.pkey: f"tenant {a.tenant}'s" for a in self.allocations.values()}
        whose.update({p: "retired" for p in self.retired})
        found = []
        for p in snap.pkeys:
            if int(p.pkey, 16) == MANAGEMENT_PKEY or (held is not None and p.pkey == held.pkey):
                continue
            owner = whose.get(p.pkey, "not this fabric's: another fabric's on this UFM, or made by hand")
            found += [f"host {members[g]}'s port {g} is in PKey {p.pkey} ({owner})" for g in sorted(p.members)
                      if g in members]  # fmt: skip
        return found


class FabricInput(WorkflowInput):
    fabric: str
    pkey_first: str = Field("0x100", description="Lowest PKey this fabric hands out.")
    pkey_last: str = Field("0x7ffe", description="Highest PKey this fabric hands out.")
    history_limit: int = Field(HISTORY_LIMIT, ge=50, description="Continue-as-new past this many history events.")
    state: FabricState = Field(default_factory=FabricState, description="Carried across continue-as-new.")

    _n = field_validator("fabric")(validate_fabric_name)
    _p = field_validator("pkey_first", "pkey_last")(normalize_pkey)

    @model_validator(mode="after")
    def _range(self) -> FabricInput:
        if int(self.pkey_first, 16) > int(self.pkey_last, 16):
            raise ValueError(f"pkey_first: {self.pkey_first} is above pkey_last {self.pkey_last}")
        return self

    def workflow_id(self) -> str:
        return f"fabric/{self.fabric}"

    def outside_range(self, pkey: str) -> str | None:
        """Why the fabric may not write `pkey` for a tenant (outside the range it hands out), or None."""
        if int(self.pkey_first, 16) <= int(pkey, 16) <= int(self.pkey_last, 16):
            return None
        return f"PKey {pkey} is outside this fabric's range {self.pkey_first}-{self.pkey_last}"


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
