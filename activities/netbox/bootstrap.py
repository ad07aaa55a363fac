"""The bootstrap catalogue: the custom fields, choice sets, tags, roles and types Millwright needs in NetBox, by
section, created once by InventoryBootstrap (workflows/inventory/bootstrap.py)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from activities.models import StrictModel
from activities.netbox.models import (
    BURNIN_CHOICE_SET,
    BURNIN_RESULTS,
    CF_BMC_CREDENTIALS,
    CF_BMC_URL,
    CF_BURNIN_AT,
    CF_BURNIN_REPORT,
    CF_BURNIN_RESULT,
    CF_EXPECTED_GPUS,
    CF_FIRMWARE,
    CF_FIRMWARE_BASELINE,
    CF_FIRMWARE_INSTALLED,
    CF_GPU_MODEL,
    CF_GPU_UUID,
    CF_IB_PORT_GUID,
    CF_TENANT_PKEY,
    CLUSTER_TYPE,
    GPU_ITEM_ROLE,
    GPU_SERVER_ROLE,
    GUID_PATTERN,
    NVIDIA,
    PKEY_PATTERN,
    TAG_MANAGED,
    TAG_QUARANTINE,
)


class BootstrapObject(StrictModel):
    """One object the bootstrap ensures: its endpoint, lookup key and creation fields."""

    endpoint: str  # "extras.custom_fields"
    key: dict[str, Any]  # how to find it: {"name": ...} or {"slug": ...}
    fields: dict[str, Any] = Field(default_factory=dict)  # created with key | fields
    # List fields whose wanted values must be present (added if missing, never removed).
    ensure_contains: list[str] = Field(default_factory=list)

    @property
    def label(self) -> str:
        kind = self.endpoint.split(".", 1)[1].rstrip("s").replace("_", " ")
        return f"{kind} {next(iter(self.key.values()))}"


def _cf(name: str, type_: str, object_types: list[str], label: str, description: str, **extra: Any) -> BootstrapObject:
    return BootstrapObject(
        endpoint="extras.custom_fields",
        key={"name": name},
        fields={"type": type_, "object_types": object_types, "label": label, "description": description,
                "group_name": "Millwright", **extra},
        ensure_contains=["object_types"],
    )  # fmt: skip


BOOTSTRAP_SECTIONS: dict[str, list[BootstrapObject]] = {
    # Order matters: the choice set before the custom field using it.
    "custom-field-choice-sets": [
        BootstrapObject(
            endpoint="extras.custom_field_choice_sets",
            key={"name": BURNIN_CHOICE_SET},
            fields={
                "extra_choices": [[v, v.capitalize()] for v in BURNIN_RESULTS],
                "description": "Outcome of a Millwright burn-in",
            },
        ),
    ],
    "custom-fields": [
        _cf(
            CF_BURNIN_RESULT,
            "select",
            ["dcim.device"],
            "Last burn-in result",
            "Set by Millwright's burn-in",
            choice_set={"name": BURNIN_CHOICE_SET},
        ),
        _cf(CF_BURNIN_AT, "datetime", ["dcim.device"], "Last burn-in at", "When the last burn-in finished"),
        _cf(CF_BURNIN_REPORT, "url", ["dcim.device"], "Burn-in report", "Link to the last burn-in report"),
        _cf(
            CF_IB_PORT_GUID,
            "text",
            ["dcim.interface"],
            "InfiniBand port GUID",
            "Port GUID (16 hex digits)",
            validation_regex=GUID_PATTERN,
        ),
        _cf(
            CF_TENANT_PKEY,
            "text",
            ["tenancy.tenant"],
            "InfiniBand PKey",
            "The tenant's partition key (0x1-0x7ffe)",
            validation_regex=PKEY_PATTERN,
        ),
        _cf(CF_GPU_UUID, "text", ["dcim.inventoryitem", "dcim.module"], "GPU UUID", "NVML UUID of the GPU"),
        _cf(CF_FIRMWARE, "text", ["dcim.inventoryitem", "dcim.module"], "Firmware", "Firmware / VBIOS version"),
        _cf(CF_BMC_URL, "url", ["dcim.device"], "BMC Redfish URL", "Base URL of the server's BMC (Redfish)"),
        _cf(
            CF_BMC_CREDENTIALS,
            "text",
            ["dcim.device"],
            "BMC credentials reference",
            "Where the BMC's user:password is kept (env:NAME or file:/path), never the password",
            validation_regex=r"^(env|file):.+$",
        ),
        _cf(CF_EXPECTED_GPUS, "integer", ["dcim.device"], "Expected GPUs", "How many GPUs burn-in must find"),
        _cf(CF_GPU_MODEL, "text", ["dcim.device"], "Expected GPU model", "e.g. NVIDIA H200"),
        _cf(
            CF_FIRMWARE_BASELINE,
            "json",
            ["dcim.device"],
            "Firmware baseline",
            "Firmware inventory name -> the version burn-in expects",
        ),
        _cf(
            CF_FIRMWARE_INSTALLED,
            "json",
            ["dcim.device"],
            "Firmware installed",
            "Firmware inventory name -> the version Millwright's last firmware update read back",
        ),
    ],
    "tags": [
        BootstrapObject(
            endpoint="extras.tags", key={"slug": slug}, fields={"name": slug, "color": color, "description": d}
        )
        for slug, color, d in [
            (TAG_QUARANTINE, "f44336", "Held out of service by Millwright until a human clears it"),
            (TAG_MANAGED, "2196f3", "Lifecycle managed by Millwright"),
            ("millwright-burnin-passed", "4caf50", "Passed Millwright's last burn-in"),
            ("millwright-burnin-failed", "ff9800", "Failed Millwright's last burn-in"),
        ]
    ],
    "roles": [
        BootstrapObject(
            endpoint="dcim.device_roles",
            key={"slug": GPU_SERVER_ROLE},
            fields={"name": "GPU server", "color": "76b900", "vm_role": False},
        ),
        BootstrapObject(
            endpoint="dcim.inventory_item_roles", key={"slug": GPU_ITEM_ROLE}, fields={"name": "GPU", "color": "76b900"}
        ),
        BootstrapObject(endpoint="dcim.manufacturers", key={"slug": NVIDIA}, fields={"name": "NVIDIA"}),
        BootstrapObject(
            endpoint="virtualization.cluster_types",
            key={"slug": CLUSTER_TYPE},
            fields={"name": "Millwright GPU cluster"},
        ),
    ],
    # Statuses are NetBox choices (extended only through FIELD_CHOICES in its configuration):
    # the bootstrap checks that the ones Millwright uses are offered.
    "statuses": [],
}


class BootstrapRequest(StrictModel):
    section: str

    @field_validator("section")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in BOOTSTRAP_SECTIONS:
            raise ValueError(f"unknown bootstrap section {value!r}; known: {', '.join(BOOTSTRAP_SECTIONS)}")
        return value


class BootstrapSectionResult(StrictModel):
    section: str
    created: list[str] = Field(default_factory=list)
    updated: list[str] = Field(default_factory=list)
    existing: list[str] = Field(default_factory=list)
