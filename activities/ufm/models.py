"""The UFM activities' inputs and results, and port GUIDs and PKeys in the form UFM writes them.

Pydantic models and pure functions only: the fabric workflows (workflows/fabric/) import them. A PKey is 0x1-0x7ffe;
0x7fff, `MANAGEMENT_PKEY`, is UFM's read-only management key.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from activities.models import StrictModel

_GUID = re.compile(r"^(0x)?([0-9a-fA-F]{16})$")
_PKEY = re.compile(r"^0x[0-9a-fA-F]{1,4}$")
MANAGEMENT_PKEY = 0x7FFF

Membership = Literal["full", "limited"]


def normalize_guid(value: str) -> str:
    """A port GUID as UFM writes it: 16 lowercase hex digits, no 0x, no colons."""
    m = _GUID.match(value.replace(":", "").strip())
    if not m:
        raise ValueError(f"{value!r} is not a port GUID (16 hex digits)")
    return m.group(2).lower()


def normalize_pkey(value: str) -> str:
    """A PKey as UFM writes it (``0x1a``); 0x1-0x7ffe (0x7fff is UFM's read-only management key)."""
    if not isinstance(value, str) or not _PKEY.match(value.strip()):
        raise ValueError(f"{value!r} is not a PKey (a hex string 0x1-0x7ffe)")
    n = int(value, 16)
    if not 0 < n < MANAGEMENT_PKEY:
        raise ValueError(f"PKey {value} is outside 0x1-0x7ffe (0x7fff is the read-only management key)")
    return f"0x{n:x}"


def _guids(values: list[str]) -> list[str]:
    return sorted({normalize_guid(v) for v in values})


def _pkey(value: str) -> str:
    return normalize_pkey(value)


class HostsRequest(StrictModel):
    hosts: list[str] = Field(min_length=1)


class HostPorts(StrictModel):
    host: str
    guids: list[str] = Field(default_factory=list, description="Host HCA port GUIDs UFM attributes to this system.")


class ResolvedHosts(StrictModel):
    hosts: list[HostPorts]
    unknown: list[str] = Field(default_factory=list, description="Hosts UFM has no HCA ports for.")


class PKeyRef(StrictModel):
    pkey: str
    _p = field_validator("pkey")(_pkey)


class EnsurePKey(PKeyRef):
    partition_name: str = Field("", description="Sent where UFM takes it (6.22 and later).")
    ip_over_ib: bool = True
    index0: bool = Field(True, description="Store the PKey at index 0 of each port's PKey table, as NVIDIA's "
                                           "clients do.")  # fmt: skip


class EnsuredPKey(StrictModel):
    pkey: str
    created: bool


class AddGuids(PKeyRef):
    guids: list[str] = Field(min_length=1)
    membership: Membership = "full"
    ip_over_ib: bool = True
    index0: bool = Field(True, description="Store the PKey at index 0 of each port's PKey table (see EnsurePKey).")
    _g = field_validator("guids")(_guids)


class RemoveGuids(PKeyRef):
    guids: list[str] = Field(min_length=1)
    _g = field_validator("guids")(_guids)


class MembershipChange(StrictModel):
    pkey: str
    changed: list[str] = Field(default_factory=list, description="GUIDs this attempt added or removed.")
    unchanged: list[str] = Field(default_factory=list, description="Already present (add) or absent (remove).")
    membership_changed: list[str] = Field(
        default_factory=list, description="Members whose membership this attempt changed (PUT)."
    )
    pkey_deleted: bool = Field(False, description="UFM deleted the PKey with its last member.")


class PKeyMembers(StrictModel):
    pkey: str
    exists: bool
    partition: str = ""
    members: dict[str, str] = Field(default_factory=dict, description="GUID -> membership (full/limited).")


class DeletedPKey(StrictModel):
    pkey: str
    deleted: bool
    existed: bool
    remaining: dict[str, str] = Field(default_factory=dict, description="Members left: the PKey was kept.")


class VirtualPort(StrictModel):
    host: str
    port_guid: str = Field(description="The physical port the virtual (SR-IOV) port is on.")


class FabricSnapshot(StrictModel):
    pkeys: list[PKeyMembers]
    hosts_by_guid: dict[str, str] = Field(default_factory=dict, description="Port GUID -> UFM system name.")
    virtual: dict[str, VirtualPort] = Field(default_factory=dict, description="Virtual port GUID -> where it is.")


class EmptyRequest(StrictModel):
    pass


class PKeyList(StrictModel):
    pkeys: list[str] = Field(description="Every PKey UFM holds, without members, in ascending order.")


class GuidsRequest(StrictModel):
    guids: list[str] = Field(min_length=1, max_length=20000)
    _g = field_validator("guids")(_guids)


class PortHosts(StrictModel):
    hosts: dict[str, str] = Field(default_factory=dict, description="Port GUID -> UFM system name, for the "
                                                                    "GUIDs asked for that UFM knows.")  # fmt: skip
    virtual: dict[str, VirtualPort] = Field(default_factory=dict, description="Virtual port GUID -> where it is, "
                                                                              "for the GUIDs asked for.")  # fmt: skip


class FabricCall(StrictModel):
    """One update of a Fabric entity workflow, started with the update if it does not run yet."""

    fabric: str
    update: Literal["allocate", "confirm", "withdraw", "begin_release", "finish_release", "state"]
    payload: dict[str, Any] = Field(default_factory=dict)
