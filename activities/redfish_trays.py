"""Where an NVL72 tray sits in its rack, as its own BMC says (../shared/reference/topology-and-gangs.md §4): a
compute tray's `Chassis/CBC_0` (the "18x1RU CBL Cartridge") carries `SerialNumber` and `Oem.Nvidia`'s
`ComputeTrayIndex`, `ChassisPhysicalSlotNumber` and `TopologyId`. A rack's power sequence goes by the index
(workflows/remediation/rack_remediation.py); a BMC without such a chassis is no NVL72 compute tray: no index."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from activities.models import StrictModel

CARTRIDGE_CHASSIS = "CBC_0"


class TrayPlace(StrictModel):
    index: int | None = Field(None, description="ComputeTrayIndex; None: the BMC shows no NVL72 cartridge chassis.")
    slot: int | None = Field(None, description="ChassisPhysicalSlotNumber.")
    topology_id: int | None = None
    serial: str = ""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tray_place(talk: Any) -> TrayPlace:
    """`talk`: an activities.redfish.Conversation. The cartridge chassis among the BMC's Chassis members."""
    chassis = talk.link(talk.root, "Chassis")
    member = next((m["@odata.id"] for m in talk.json(chassis).get("Members", []) if chassis and
                   m.get("@odata.id", "").rstrip("/").endswith(f"/{CARTRIDGE_CHASSIS}")), None) if chassis else None  # fmt: skip
    if member is None:
        return TrayPlace()
    doc = talk.json(member)
    nvidia = (doc.get("Oem") or {}).get("Nvidia") or {}
    return TrayPlace(index=_int(nvidia.get("ComputeTrayIndex")), slot=_int(nvidia.get("ChassisPhysicalSlotNumber")),
                     topology_id=_int(nvidia.get("TopologyId")), serial=str(doc.get("SerialNumber") or ""))  # fmt: skip
