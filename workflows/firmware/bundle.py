"""A firmware bundle: the components to install on a server, and the plan for one server (which components are
already at their version, which to update, in what order, and how each becomes active)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from activities.firmware.models import ApplyTime, TransferProtocol
from activities.models import BaseUrl, StrictModel

Activation = Literal["none", "reset", "ac_power_cycle"]


class FirmwareComponent(StrictModel):
    """One image and the firmware inventory entries it updates."""

    name: str = Field(min_length=1, max_length=64, description="Firmware inventory ID, e.g. BIOS, BMC, CPLD.")
    targets: list[str] = Field(
        default_factory=list, description="Inventory IDs the image updates (one GPU image for GPU0..GPU7); default "
        "[name].",
    )  # fmt: skip
    image_uri: BaseUrl = Field(description="Where the BMC fetches the image (SimpleUpdate ImageURI).")
    version: str = Field(min_length=1, max_length=64, description="The version the image installs.")
    transfer_protocol: TransferProtocol | None = Field(None, description="Default: the image URI's scheme.")
    apply_time: ApplyTime = "Immediate"
    push: bool = Field(
        False, description="The worker fetches the image and pushes it to the BMC (UpdateService "
        "MultipartHttpPushUri) where the BMC offers that; else the BMC pulls image_uri (SimpleUpdate).",
    )  # fmt: skip
    order: int = Field(0, description="Lower first; equal orders keep the bundle's order.")
    activation: Activation = Field(
        "reset", description="What makes the new version active: nothing (it is active when its task completes; a "
        "BMC that restarts itself is waited out), a system reset, or an AC power cycle of the chassis.",
    )  # fmt: skip

    @field_validator("targets")
    @classmethod
    def _targets(cls, value: list[str]) -> list[str]:
        if any(not t for t in value) or len(set(value)) != len(value):
            raise ValueError("targets must be distinct, non-empty inventory IDs")
        return value

    @property
    def inventory_ids(self) -> list[str]:
        return self.targets or [self.name]


class FirmwareBundle(StrictModel):
    name: str = Field(min_length=1, max_length=128, description="e.g. hgx-h200-2026.11")
    components: list[FirmwareComponent] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> FirmwareBundle:
        seen: set[str] = set()
        for c in self.components:
            if seen & set(c.inventory_ids):
                raise ValueError(f"components: {c.name} updates an inventory entry another component updates")
            seen |= set(c.inventory_ids)
        return self

    def ordered(self) -> list[FirmwareComponent]:
        return sorted(self.components, key=lambda c: c.order)


ComponentState = Literal["pending", "at-target", "updating", "awaiting-reset", "awaiting-ac-power-cycle", "active",
                         "failed"]  # fmt: skip


class ComponentStatus(StrictModel):
    """Where one component stands on this server (the `components` query, the result)."""

    name: str
    version: str
    installed: dict[str, str] = Field(default_factory=dict, description="Versions read before the update.")
    state: ComponentState = "pending"
    task: str | None = Field(None, description="The BMC's Task URI.")
    task_state: str | None = Field(None, description="The Task's TaskState when last read.")
    bmc_restarted: bool = False
    pushed: bool = Field(False, description="Its image went to the BMC in a multipart push (else SimpleUpdate).")
    message: str = ""


def plan(bundle: FirmwareBundle, inventory: dict[str, str]) -> list[ComponentStatus]:
    """Every component in install order: at its version already, or pending."""
    out = []
    for c in bundle.ordered():
        installed = {t: inventory.get(t, "(missing)") for t in c.inventory_ids}
        at_target = all(v == c.version for v in installed.values())
        out.append(ComponentStatus(name=c.name, version=c.version, installed=installed,
                                   state="at-target" if at_target else "pending"))  # fmt: skip
    return out
