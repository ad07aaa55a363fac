"""NetBox's names Millwright relies on (custom fields, tags, roles, statuses) and the request and result models of the
inventory activities."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from activities.models import StrictModel

_SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")
GUID_PATTERN = r"^(0x)?[0-9a-fA-F]{16}$"
PKEY_PATTERN = r"^0x[0-9a-fA-F]{1,4}$"

# Device statuses Millwright moves devices through (NetBox's own choices; FIELD_CHOICES may add more).
DEVICE_STATUSES = ("planned", "staged", "active", "failed", "offline", "inventory", "decommissioning")
JOURNAL_KINDS = ("info", "success", "warning", "danger")

# Custom field names, used by these activities and created by the bootstrap.
CF_BURNIN_RESULT = "millwright_burnin_result"
CF_BURNIN_AT = "millwright_burnin_at"
CF_BURNIN_REPORT = "millwright_burnin_report"
CF_IB_PORT_GUID = "millwright_ib_port_guid"
CF_TENANT_PKEY = "millwright_pkey"
CF_GPU_UUID = "millwright_gpu_uuid"
CF_FIRMWARE = "millwright_firmware"
# What burn-in needs to know about a server: where its BMC is (and where its credentials are kept,
# as a secret reference, never the password), what GPUs it should have, which firmware it should run.
CF_BMC_URL = "millwright_bmc_url"
CF_BMC_CREDENTIALS = "millwright_bmc_credentials"
CF_EXPECTED_GPUS = "millwright_expected_gpus"
CF_GPU_MODEL = "millwright_gpu_model"
CF_FIRMWARE_BASELINE = "millwright_firmware_baseline"
# What a firmware update read back from the BMC at its end (workflows/firmware/).
CF_FIRMWARE_INSTALLED = "millwright_firmware_installed"
BURNIN_CHOICE_SET = "millwright-burnin-results"
BURNIN_RESULTS = ("passed", "failed", "aborted")

TAG_QUARANTINE = "millwright-quarantine"
TAG_MANAGED = "millwright-managed"
GPU_SERVER_ROLE = "gpu-server"
GPU_ITEM_ROLE = "gpu"
NVIDIA = "nvidia"
CLUSTER_TYPE = "millwright-gpu-cluster"


def _slug(value: str | None) -> str | None:
    if value is not None and not _SLUG.match(value):
        raise ValueError(f"{value!r} is not a NetBox slug (letters, digits, '-', '_')")
    return value


class DeviceLookup(StrictModel):
    """Find one device by exactly one stable key: name (optionally within a site), serial or asset tag."""

    name: str | None = None
    serial: str | None = None
    asset_tag: str | None = None
    site: str | None = Field(None, description="Site slug, to tell apart devices of the same name.")

    _site = field_validator("site")(_slug)

    @model_validator(mode="after")
    def _one_key(self) -> DeviceLookup:
        keys = [k for k in ("name", "serial", "asset_tag") if getattr(self, k)]
        if len(keys) != 1:
            raise ValueError("give exactly one of name, serial or asset_tag")
        return self

    def __str__(self) -> str:
        key = "name" if self.name else "serial" if self.serial else "asset tag"
        value = self.name or self.serial or self.asset_tag
        return f"device with {key} {value!r}" + (f" in site {self.site!r}" if self.site else "")


NAMES_PER_REQUEST = 50  # ~1.5 KB of `name=` parameters: under gunicorn's 4,094-byte request line


class DeviceQuery(StrictModel):
    """List devices; every given filter must match (slugs, a status value)."""

    role: str | None = None
    site: str | None = None
    status: str | None = None
    tag: str | None = None
    tenant: str | None = None
    limit: int = Field(1000, ge=1, le=10000)

    _slugs = field_validator("role", "site", "tag", "tenant")(_slug)


class DevicePageQuery(DeviceQuery):
    """One page of the devices matching every given filter, in ID order: a fleet read page by page, never whole."""

    names: list[str] = Field(default_factory=list, max_length=1000, description="Only devices with these names.")
    after_id: int = Field(0, ge=0, description="Only devices with a larger ID: where the previous page ended.")
    limit: int = Field(500, ge=1, le=1000, description="Devices per page.")


class DeviceInfo(StrictModel):
    id: int
    name: str | None
    serial: str = ""
    asset_tag: str | None = None
    status: str
    role: str | None = None
    site: str | None = None
    tenant: str | None = None
    cluster: str | None = None
    tags: list[str] = Field(default_factory=list)
    custom_fields: dict[str, Any] = Field(default_factory=dict)


class DevicePage(StrictModel):
    devices: list[DeviceInfo]
    next_after_id: int | None = Field(None, description="The next page's after_id; None: this was the last page.")


class FoundDevice(StrictModel):
    device: DeviceInfo | None = None


class SetStatusRequest(StrictModel):
    device: DeviceLookup
    status: str = Field(min_length=1, description="A NetBox device status value, e.g. failed; NetBox validates it.")
    reason: str = Field(min_length=1, max_length=4000)
    kind: Literal["info", "success", "warning", "danger"] = "info"


class StatusChange(StrictModel):
    device: str
    previous: str
    status: str
    changed: bool = Field(description="False when the device already had this status.")
    journal_entry_id: int
    journal_created: bool = Field(description="False when a retry found the entry already written.")


class DeviceTagsRequest(StrictModel):
    device: DeviceLookup
    add: list[str] = Field(default_factory=list, description="Tag slugs to add (they must exist).")
    remove: list[str] = Field(default_factory=list, description="Tag slugs to remove.")

    _slugs = field_validator("add", "remove")(lambda v: [_slug(t) for t in v])


class DeviceTags(StrictModel):
    device: str
    tags: list[str]
    changed: bool


class BurnInRecord(StrictModel):
    device: DeviceLookup
    result: Literal["passed", "failed", "aborted"]
    finished_at: datetime
    report_url: str | None = None
    summary: str = Field(min_length=1, max_length=8000)


class DeviceRecorded(StrictModel):
    device: str
    updated_fields: list[str]
    journal_entry_id: int
    journal_created: bool


class BurnInRecorded(DeviceRecorded):
    """A burn-in's verdict recorded."""


class FirmwareRecord(StrictModel):
    device: DeviceLookup
    result: Literal["updated", "up-to-date", "failed"]
    bundle: str = Field(min_length=1)
    versions: dict[str, str] = Field(default_factory=dict, description="The firmware inventory read back.")
    summary: str = Field(min_length=1, max_length=8000)


class GpuInfo(StrictModel):
    index: int = Field(ge=0, le=63)
    model: str = Field(min_length=1, description="e.g. NVIDIA H200 (the inventory item's part ID)")
    serial: str = ""
    uuid: str = ""
    firmware: str = ""
    pci_bus_id: str = ""

    @property
    def item_name(self) -> str:
        return f"GPU{self.index}"


class GpuInventory(StrictModel):
    device: DeviceLookup
    gpus: list[GpuInfo]


class InterfaceInfo(StrictModel):
    name: str = Field(min_length=1, max_length=64)
    type: str = Field("infiniband-ndr", description="NetBox interface type value, e.g. infiniband-ndr.")
    port_guid: str | None = Field(None, description="InfiniBand port GUID, 16 hex digits (0x optional).")
    mac_address: str | None = None
    description: str = ""


class InterfaceInventory(StrictModel):
    device: DeviceLookup
    interfaces: list[InterfaceInfo]


class UpsertResult(StrictModel):
    """What an upsert of several objects did, by name."""

    created: list[str] = Field(default_factory=list)
    updated: list[str] = Field(default_factory=list)
    unchanged: list[str] = Field(default_factory=list)


class TenantSpec(StrictModel):
    name: str = Field(min_length=1, max_length=100)
    slug: str = Field(min_length=1, max_length=100)
    pkey: str | None = Field(None, description="InfiniBand partition key, e.g. 0x8001 style hex.")
    description: str = ""

    _slug_ok = field_validator("slug")(_slug)


class ClusterSpec(StrictModel):
    name: str = Field(min_length=1, max_length=100)
    type: str = Field(CLUSTER_TYPE, description="Cluster type slug (the bootstrap creates the default).")
    tenant: str | None = Field(None, description="Tenant slug.")
    status: str = "active"
    description: str = ""

    _slugs = field_validator("type", "tenant")(_slug)


class ObjectResult(StrictModel):
    id: int
    name: str
    created: bool
    updated: list[str] = Field(default_factory=list, description="Fields changed on an existing object.")


class ClusterAssignment(StrictModel):
    cluster: str = Field(min_length=1, description="Cluster name.")
    devices: list[DeviceLookup]
    missing_ok: bool = Field(False, description="Report devices NetBox does not know in `missing` instead of failing.")


class IbPortQuery(StrictModel):
    devices: list[str] = Field(min_length=1, description="Device names.")


class IbPort(StrictModel):
    interface: str
    guid: str


class DeviceIbPorts(StrictModel):
    device: str
    found: bool = Field(description="False when NetBox has no device of this name.")
    ports: list[IbPort] = Field(default_factory=list)


class TenantJournal(StrictModel):
    """A journal entry on a tenant (e.g. who moved its administration, and why)."""

    tenant: str = Field(min_length=1, description="Tenant slug.")
    text: str = Field(min_length=1)
    kind: Literal["info", "success", "warning", "danger"] = "info"

    _slug_ok = field_validator("tenant")(_slug)


class TenantPKeyRecord(StrictModel):
    """A tenant's InfiniBand partition: its PKey (None when released) and members, journaled on the tenant."""

    tenant: str = Field(min_length=1, description="Tenant slug.")
    name: str | None = Field(None, description="Tenant name, when the tenant must be created.")
    fabric: str
    pkey: str | None
    members: dict[str, list[str]] = Field(default_factory=dict, description="host -> port GUIDs")

    _slug_ok = field_validator("tenant")(_slug)


class AssignmentResult(StrictModel):
    cluster: str
    assigned: list[str] = Field(default_factory=list)
    already: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list, description="Lookups with no device (with missing_ok).")
