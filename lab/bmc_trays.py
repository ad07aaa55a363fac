"""The rack position a lab BMC knows when it plays a tray of a GB200 NVL72 rack (lab/nvl72.py `Nvl72Fleet.bmc_specs`).

A server spec's ``tray`` (``{"kind": "compute"|"switch", "rack", "index", "slot", "topology_id"?, "chassis_serial"?}``)
makes its BMC one of a rack's: NVL72 has one BMC per compute tray and per NVLink switch tray, and no rack root
(../shared/reference/topology-and-gangs.md §4). Both kinds keep the lab's ``Systems/1`` (its power, so the same
``ComputerSystem.Reset`` power-cycles either) and ``Chassis/1``, which gains the Redfish ``Location`` of the tray
(``Placement.Rack``, ``PartLocation`` slot and label). Besides it:

* a compute tray serves ``Chassis/CBC_0``, the rack's cable cartridge as bmcweb shows it ("18x1RU CBL Cartridge";
  ``SerialNumber``, the rack's cartridge serial, the same on every tray of the rack, and ``Oem.Nvidia``
  ``{ChassisPhysicalSlotNumber, ComputeTrayIndex, RevisionId, TopologyId}``, NvidiaCBCChassis v1_4_0), so a client
  tells a tray's place from (SerialNumber, ComputeTrayIndex) as NVIDIA's infra controller does;
* a switch tray serves ``Chassis/MGX_NVSwitch_0`` and ``_1``, its two NVLink switch ASICs (Component, NVIDIA, model
  ``N5200_LD``), after NVIDIA's infra controller's BMC mock of that tray; assumed: the real tray names its system
  ``System_0`` (the lab keeps ``Systems/1``, which clients find through ``Systems`` anyway) and has more chassis
  (ERoTs, CPLD, BMC EEPROM) the lab leaves out. Its GPUs are 0 and its firmware has ``NVSwitch0``/``NVSwitch1``; a
  compute tray's has no NVSwitch (they sit in the switch trays).

``RevisionId`` is 2 (the only CBC topology revision bmcweb decodes); ``TopologyId`` is the spec's (the lab gives
every rack 1; its codes are NVIDIA's and undocumented).
"""

from __future__ import annotations

import uuid
from typing import Any

CBC_REVISION = 2
SWITCH_ASICS = 2  # NVLink switch chips per switch tray
HGX_NVSWITCHES = 4  # an HGX baseboard's, what a server without a tray has
TRAY_KINDS = {"compute": 18, "switch": 9}  # trays of each kind in a rack: the largest index + 1


def normalize_tray(name: str, tray: Any) -> dict:
    """A spec's `tray`, checked, with its derived defaults (`chassis_serial` from the rack)."""
    if not isinstance(tray, dict):
        raise ValueError(f"server {name}: tray must be an object")
    t = dict(tray)
    unknown = set(t) - {"kind", "rack", "index", "slot", "topology_id", "chassis_serial"}
    if unknown:
        raise ValueError(f"server {name}: tray: unknown keys {sorted(unknown)}")
    if t.get("kind") not in TRAY_KINDS:
        raise ValueError(f"server {name}: tray.kind must be one of {sorted(TRAY_KINDS)}")
    if not isinstance(t.get("rack"), str) or not t["rack"]:
        raise ValueError(f"server {name}: tray.rack must name the rack")
    for key, top in (("index", TRAY_KINDS[t["kind"]] - 1), ("slot", 255)):
        if not isinstance(t.get(key), int) or not 0 <= t[key] <= top:
            raise ValueError(f"server {name}: tray.{key} must be an integer from 0 to {top}")
    t.setdefault("topology_id", 1)
    cartridge = uuid.uuid5(uuid.NAMESPACE_URL, f"millwright-lab/{t['rack']}/cbc")  # as lab/bmc.py derives ids
    t.setdefault("chassis_serial", "1821" + str(cartridge.int)[:9])
    return t


def nvswitches(spec: dict) -> int:
    """The NVSwitch chips whose firmware the server reports."""
    tray = spec.get("tray")
    if tray is None:
        return HGX_NVSWITCHES
    return SWITCH_ASICS if tray["kind"] == "switch" else 0


def tray_chassis_ids(spec: dict) -> list[str]:
    """The chassis a tray's BMC serves besides `1`."""
    tray = spec.get("tray")
    if tray is None:
        return []
    return ["CBC_0"] if tray["kind"] == "compute" else [f"MGX_NVSwitch_{n}" for n in range(SWITCH_ASICS)]


def location(spec: dict) -> dict | None:
    """Chassis/1's Redfish Location: the rack and the tray's slot."""
    tray = spec.get("tray")
    if tray is None:
        return None
    label = f"{'Compute' if tray['kind'] == 'compute' else 'NVLink Switch'} Tray {tray['index']}"
    return {"PartLocation": {"LocationType": "Slot", "LocationOrdinalValue": tray["slot"], "ServiceLabel": label},
            "Placement": {"Rack": tray["rack"]}}  # fmt: skip


def tray_chassis(spec: dict, chassis_id: str, root: str) -> dict | None:
    """The document of one of `tray_chassis_ids`, else None."""
    if chassis_id not in tray_chassis_ids(spec):
        return None
    tray = spec["tray"]
    doc: dict[str, Any] = {
        "@odata.id": f"{root}/Chassis/{chassis_id}",
        "@odata.type": "#Chassis.v1_23_0.Chassis",
        "Id": chassis_id,
        "ChassisType": "Component",
        "Status": {"State": "Enabled", "Health": "OK"},
        "Links": {"ManagedBy": [{"@odata.id": f"{root}/Managers/1"}]},
    }
    if tray["kind"] == "compute":
        return doc | {
            "Name": "18x1RU CBL Cartridge",
            "Manufacturer": "Nvidia",
            "Model": "18x1RU CBL Cartridge",
            "PartNumber": "750-0567-002",
            "SerialNumber": tray["chassis_serial"],
            "Oem": {"Nvidia": {"@odata.type": "#NvidiaChassis.v1_4_0.NvidiaCBCChassis",
                               "ChassisPhysicalSlotNumber": tray["slot"], "ComputeTrayIndex": tray["index"],
                               "RevisionId": CBC_REVISION, "TopologyId": tray["topology_id"]}},
        }  # fmt: skip
    return doc | {
        "Name": f"NVLink Switch {chassis_id[-1]}",
        "Manufacturer": "NVIDIA",
        "Model": "N5200_LD",
        "PartNumber": "920-9K36W-00MV-GS0",
        "SerialNumber": spec["serial"],
        "Location": location(spec),
    }
