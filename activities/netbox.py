"""Inventory activities against NetBox, the source of truth for devices, tenants and clusters.

Each activity does one thing and is safe to retry after a crash at any line: it reads
first and writes only the difference, looking objects up by a stable key (device name,
serial or asset tag; slugs; (device, name) for interfaces and inventory items). Journal
entries carry a marker naming the workflow run and activity that wrote them, and are
only created when no entry with that marker exists, so a retry never duplicates one.
A write whose answer is lost (the connection dropped or timed out after sending, a
gateway's 5xx) is read back at once (`NetBoxActivities._write`): when it landed, the
attempt goes on and its result says it made the change, instead of leaving the write
to a retry that would find it and report it as already there.

Errors: NetBox's 400 (a bad choice, a failed validation) is non-retryable and carries
NetBox's own message (type ``NetBoxRejected``); so are 401/403 (``NetBoxAuth``), missing
bootstrap objects (``NetBoxNotBootstrapped``) and a worker without NetBox settings
(``NetBoxNotConfigured``). 5xx, 409, 429, timeouts and connection errors are raised
retryable (``NetBoxUnavailable``) for the workflow's retry policy; the client itself never
retries, so every attempt is visible.

TLS: NetBox's certificate is verified against the default CAs, or the CA bundle of
``MILLWRIGHT_NETBOX_CA_BUNDLE``; ``MILLWRIGHT_NETBOX_VERIFY_TLS=false`` turns verification off. A
certificate the worker does not trust, or one issued for another name, is a non-retryable
``TlsVerificationFailed`` naming those settings (activities/tls.py).

The API token is read from a secret reference (`activities.secrets.SecretRef`) inside the
activity, at each attempt; it never appears in an activity's input, output or error.
pynetbox is synchronous: calls run in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import Field, field_validator, model_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.secrets import SecretError, SecretRef
from activities.tls import TlsFix, Trust, ca_bundle_ref

USER_AGENT = "millwright-worker"
_REQUEST_TIMEOUT = 15.0
_SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")
_GUID = r"^(0x)?[0-9a-fA-F]{16}$"
_PKEY = r"^0x[0-9a-fA-F]{1,4}$"

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
BURNIN_CHOICE_SET = "millwright-burnin-results"
BURNIN_RESULTS = ("passed", "failed", "aborted")

TAG_QUARANTINE = "millwright-quarantine"
TAG_MANAGED = "millwright-managed"
GPU_SERVER_ROLE = "gpu-server"
GPU_ITEM_ROLE = "gpu"
NVIDIA = "nvidia"
CLUSTER_TYPE = "millwright-gpu-cluster"


# ---------------------------------------------------------------- the bootstrap catalogue


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
            fields={"extra_choices": [[v, v.capitalize()] for v in BURNIN_RESULTS],
                    "description": "Outcome of a Millwright burn-in"},
        ),  # fmt: skip
    ],
    "custom-fields": [
        _cf(CF_BURNIN_RESULT, "select", ["dcim.device"], "Last burn-in result", "Set by Millwright's burn-in",
            choice_set={"name": BURNIN_CHOICE_SET}),
        _cf(CF_BURNIN_AT, "datetime", ["dcim.device"], "Last burn-in at", "When the last burn-in finished"),
        _cf(CF_BURNIN_REPORT, "url", ["dcim.device"], "Burn-in report", "Link to the last burn-in report"),
        _cf(CF_IB_PORT_GUID, "text", ["dcim.interface"], "InfiniBand port GUID", "Port GUID (16 hex digits)",
            validation_regex=_GUID),
        _cf(CF_TENANT_PKEY, "text", ["tenancy.tenant"], "InfiniBand PKey", "The tenant's partition key (0x1-0x7ffe)",
            validation_regex=_PKEY),
        _cf(CF_GPU_UUID, "text", ["dcim.inventoryitem", "dcim.module"], "GPU UUID", "NVML UUID of the GPU"),
        _cf(CF_FIRMWARE, "text", ["dcim.inventoryitem", "dcim.module"], "Firmware", "Firmware / VBIOS version"),
        _cf(CF_BMC_URL, "url", ["dcim.device"], "BMC Redfish URL", "Base URL of the server's BMC (Redfish)"),
        _cf(CF_BMC_CREDENTIALS, "text", ["dcim.device"], "BMC credentials reference",
            "Where the BMC's user:password is kept (env:NAME or file:/path), never the password",
            validation_regex=r"^(env|file):.+$"),
        _cf(CF_EXPECTED_GPUS, "integer", ["dcim.device"], "Expected GPUs", "How many GPUs burn-in must find"),
        _cf(CF_GPU_MODEL, "text", ["dcim.device"], "Expected GPU model", "e.g. NVIDIA H200"),
        _cf(CF_FIRMWARE_BASELINE, "json", ["dcim.device"], "Firmware baseline",
            "Firmware inventory name -> the version burn-in expects"),
    ],  # fmt: skip
    "tags": [
        BootstrapObject(endpoint="extras.tags", key={"slug": slug}, fields={"name": slug, "color": color, "description": d})
        for slug, color, d in [
            (TAG_QUARANTINE, "f44336", "Held out of service by Millwright until a human clears it"),
            (TAG_MANAGED, "2196f3", "Lifecycle managed by Millwright"),
            ("millwright-burnin-passed", "4caf50", "Passed Millwright's last burn-in"),
            ("millwright-burnin-failed", "ff9800", "Failed Millwright's last burn-in"),
        ]
    ],
    "roles": [
        BootstrapObject(endpoint="dcim.device_roles", key={"slug": GPU_SERVER_ROLE},
                        fields={"name": "GPU server", "color": "76b900", "vm_role": False}),
        BootstrapObject(endpoint="dcim.inventory_item_roles", key={"slug": GPU_ITEM_ROLE},
                        fields={"name": "GPU", "color": "76b900"}),
        BootstrapObject(endpoint="dcim.manufacturers", key={"slug": NVIDIA}, fields={"name": "NVIDIA"}),
        BootstrapObject(endpoint="virtualization.cluster_types", key={"slug": CLUSTER_TYPE},
                        fields={"name": "Millwright GPU cluster"}),
    ],  # fmt: skip
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


# ---------------------------------------------------------------- models


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


class BurnInRecorded(StrictModel):
    device: str
    updated_fields: list[str]
    journal_entry_id: int
    journal_created: bool


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
    missing_ok: bool = Field(False, description="Report devices NetBox does not know in `missing` instead of "
                                                "failing.")


class IbPortQuery(StrictModel):
    devices: list[str] = Field(min_length=1, description="Device names.")


class IbPort(StrictModel):
    interface: str
    guid: str


class DeviceIbPorts(StrictModel):
    device: str
    found: bool = Field(description="False when NetBox has no device of this name.")
    ports: list[IbPort] = Field(default_factory=list)


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


# ---------------------------------------------------------------- errors


def _response_message(err: Any) -> str:
    """NetBox's own words from an error response: the JSON body, compact."""
    req = getattr(err, "req", None)
    text = getattr(err, "error", None) or (req.text if req is not None else "") or str(err)
    try:
        return json.dumps(json.loads(text), separators=(", ", ": "))[:2000]
    except (TypeError, ValueError):
        return str(text).strip()[:500]


NETBOX_TLS_FIX = TlsFix(ca="MILLWRIGHT_NETBOX_CA_BUNDLE", off="MILLWRIGHT_NETBOX_VERIFY_TLS=false")


def netbox_error(err: Exception, doing: str, trust: Trust) -> ApplicationError:
    """Map a pynetbox/requests error to what a retry can or cannot fix."""
    import pynetbox
    import requests

    tls_failure = trust.failure(err, f"{doing}: NetBox")
    if tls_failure is not None:
        return tls_failure

    if isinstance(err, (pynetbox.RequestError, pynetbox.AllocationError)):
        status = err.req.status_code
        text = f"{doing}: NetBox answered {status}: {_response_message(err)}"
        if status == 400:
            return ApplicationError(text, type="NetBoxRejected", non_retryable=True)
        if status in (401, 403):
            return ApplicationError(text, type="NetBoxAuth", non_retryable=True)
        if status in (404, 405):
            return ApplicationError(text, type="NetBoxNotFound", non_retryable=True)
        return ApplicationError(text, type="NetBoxUnavailable")
    if isinstance(err, pynetbox.ContentError):
        return ApplicationError(f"{doing}: not a NetBox API answer: {err}", type="NetBoxUnavailable")
    if isinstance(err, requests.RequestException):
        # Never the request itself: its headers hold the token.
        return ApplicationError(f"{doing}: connection failed: {type(err).__name__}", type="NetBoxUnavailable")
    return ApplicationError(f"{doing}: {type(err).__name__}: {err}", type="NetBoxUnavailable")


def _answer_lost(err: Exception) -> bool:
    """Whether a write that failed this way may have been carried out all the same: the request went (or may
    have gone) out and no answer of NetBox's came back, or a gateway answered for it."""
    import pynetbox
    import requests

    if isinstance(err, pynetbox.RequestError):
        return err.req.status_code in (500, 502, 503, 504)
    return isinstance(err, requests.RequestException) and not isinstance(err, requests.exceptions.SSLError)


def not_bootstrapped(what: str) -> ApplicationError:
    return ApplicationError(
        f"{what} is missing in NetBox; run `millwright inventory bootstrap` first",
        type="NetBoxNotBootstrapped",
        non_retryable=True,
    )


# ---------------------------------------------------------------- the client


class NetBoxConfig(StrictModel):
    """Where NetBox is and where its token is kept; the token itself is never held here."""

    url: BaseUrl
    token: SecretRef
    timeout_seconds: float = _REQUEST_TIMEOUT
    ca_bundle: str | None = Field(None, description="CA bundle reference (file:/path/to/ca.pem) for NetBox's "
                                                    "certificate; default: the default CAs")  # fmt: skip
    verify_tls: bool = True

    _ca_bundle_ok = field_validator("ca_bundle")(ca_bundle_ref)


def _session(timeout: float, verify: bool | str):
    import requests

    class TimeoutSession(requests.Session):
        """A request that hangs is an error after `timeout`; no retries (the adapter default). `verify` goes with
        each request: as the session's default, REQUESTS_CA_BUNDLE in the environment would replace it."""

        def request(self, *args, **kwargs):
            kwargs.setdefault("timeout", timeout)
            kwargs.setdefault("verify", verify)
            return super().request(*args, **kwargs)

    session = TimeoutSession()
    session.headers["User-Agent"] = USER_AGENT
    return session


T = TypeVar("T")


def _rec(record: Any) -> dict[str, Any]:
    return dict(record) if record is not None else {}


def _value(field: Any) -> Any:
    """A choice field ({'value', 'label'}) or a nested object ({'slug'/'name'}) as one value."""
    if isinstance(field, dict):
        for key in ("value", "slug", "name"):
            if key in field:
                return field[key]
    return field


def device_info(record: Any) -> DeviceInfo:
    d = _rec(record)
    return DeviceInfo(
        id=d["id"],
        name=d.get("name"),
        serial=d.get("serial") or "",
        asset_tag=d.get("asset_tag"),
        status=_value(d.get("status")),
        role=_value(d.get("role")) if d.get("role") else None,
        site=_value(d.get("site")) if d.get("site") else None,
        tenant=_value(d.get("tenant")) if d.get("tenant") else None,
        cluster=(d.get("cluster") or {}).get("name") if d.get("cluster") else None,
        tags=[t.get("slug") for t in d.get("tags") or [] if isinstance(t, dict)],
        custom_fields=d.get("custom_fields") or {},
    )


# ---------------------------------------------------------------- activities


class NetBoxActivities:
    """NetBox inventory activities. With no config every activity fails with NetBoxNotConfigured."""

    def __init__(self, config: NetBoxConfig | None) -> None:
        self._config = config

    def activities(self) -> list[Callable]:
        return [
            self.bootstrap_section,
            self.find_device,
            self.list_devices,
            self.list_devices_page,
            self.set_device_status,
            self.set_device_tags,
            self.record_burnin,
            self.record_gpus,
            self.record_interfaces,
            self.upsert_tenant,
            self.upsert_cluster,
            self.assign_devices_to_cluster,
            self.list_ib_ports,
            self.record_tenant_pkey,
        ]

    async def close(self) -> None:  # a Registration resource; sessions are per call
        return None

    # ------------------------------------------------------------ plumbing

    def _api(self) -> tuple[Any, Trust]:
        import pynetbox

        if self._config is None:
            raise ApplicationError(
                "NetBox is not configured on this worker: set MILLWRIGHT_NETBOX_URL and MILLWRIGHT_NETBOX_TOKEN "
                "(a secret reference: env:NAME or file:/path)",
                type="NetBoxNotConfigured",
                non_retryable=True,
            )
        try:
            token = self._config.token.resolve()
        except SecretError as err:
            raise ApplicationError(f"NetBox token: {err}", type="NetBoxNotConfigured", non_retryable=True) from None
        trust = Trust.resolve(NETBOX_TLS_FIX, verify=self._config.verify_tls, ca_bundle=self._config.ca_bundle,
                              setting="MILLWRIGHT_NETBOX_CA_BUNDLE")  # fmt: skip
        api = pynetbox.api(self._config.url, token=token)
        api.http_session = _session(self._config.timeout_seconds, trust.for_requests())
        return api, trust

    async def _in_thread(self, doing: str, fn: Callable[[Any], T]) -> T:
        """Run `fn(api)` in a thread, mapping NetBox and transport errors for the retry policy."""
        api, trust = self._api()
        assert self._config is not None  # _api() refuses a worker without one
        doing = f"{doing} at NetBox {self._config.url}"  # the endpoint, for a run that shows why it waits

        def call() -> T:
            try:
                return fn(api)
            finally:
                api.http_session.close()

        try:
            return await asyncio.to_thread(call)
        except ApplicationError:
            raise
        except Exception as err:
            raise netbox_error(err, doing, trust) from None

    def _upsert(self, endpoint: Any, key: dict[str, str], want: dict[str, Any]) -> ObjectResult:
        """Create the object named by `key`, or bring its fields to `want`; say which happened."""
        (name,) = key.values()
        found = endpoint.get(**key)
        if found is None:
            created = self._create(name, endpoint, {**key, **want}, key)
            return ObjectResult(id=created.id, name=name, created=True)
        diff = _diff(_rec(found), want)
        if diff:
            self._update(name, endpoint, found, diff)
        return ObjectResult(id=found.id, name=name, created=False, updated=sorted(diff))

    def _after_write(self, what: str) -> None:
        """Called after each write. A no-op; tests override it to crash an attempt mid-activity."""

    def _write(self, what: str, write: Callable[[], T], landed: Callable[[], T | None]) -> T:
        """Do `write`; when its answer is lost (`_answer_lost`), read back: `landed()` returns what the write
        would have returned when NetBox carried it out (then the attempt goes on as if the answer had come),
        else None (then the write's error goes to the retry policy, and the next attempt writes again)."""
        try:
            done = write()
        except Exception as err:
            if not _answer_lost(err):
                raise
            try:
                found = landed()
            except Exception:  # NetBox still unreachable: the write's own error says more
                found = None
            if not found:
                raise
            done = found
        self._after_write(what)
        return done

    def _create(self, what: str, endpoint: Any, fields: dict[str, Any], find: dict[str, Any]) -> Any:
        """Create an object with `fields`; a lost answer is read back with the filters `find` (its stable key)."""
        return self._write(what, lambda: endpoint.create(fields), lambda: endpoint.get(**find))

    def _update(self, what: str, endpoint: Any, record: Any, changes: dict[str, Any],
                landed: Callable[[Any], bool] | None = None) -> None:  # fmt: skip
        """PATCH `changes` onto `record`; a lost answer is read back: done when `landed(fresh record)` (default:
        the record shows every change)."""

        def applied() -> bool:
            fresh = endpoint.get(record.id)
            return fresh is not None and (landed(fresh) if landed else not _diff(_rec(fresh), changes))

        self._write(what, lambda: record.update(changes) or True, applied)

    @staticmethod
    def _run_marker() -> str:
        """Names the workflow run and activity: the same on every retry of this activity."""
        info = activity.info()
        return f"millwright:{info.workflow_id}:{info.workflow_run_id}:{info.activity_id}"

    def _resolve_device(self, api: Any, lookup: DeviceLookup) -> Any:
        record = self._find_device(api, lookup)
        if record is None:
            raise ApplicationError(f"no {lookup} in NetBox", type="DeviceNotFound", non_retryable=True)
        return record

    @staticmethod
    def _find_device(api: Any, lookup: DeviceLookup) -> Any | None:
        filters: dict[str, Any] = {}
        if lookup.name:
            filters["name"] = lookup.name
        elif lookup.serial:
            filters["serial"] = lookup.serial
        else:
            filters["asset_tag"] = lookup.asset_tag
        if lookup.site:
            filters["site"] = lookup.site
        found = list(api.dcim.devices.filter(**filters))
        if len(found) > 1:
            # Serials are not unique in NetBox, names only per (site, tenant): never guess.
            raise ApplicationError(
                f"{len(found)} devices match {lookup}: " + ", ".join(f"#{d.id} {d.name}" for d in found[:10]),
                type="AmbiguousDevice",
                non_retryable=True,
            )
        return found[0] if found else None

    def _ensure_journal(self, api: Any, record: Any, kind: str, text: str,
                        object_type: str = "dcim.device") -> tuple[int, bool]:  # fmt: skip
        """One journal entry per activity on `record` (marker in its last line); a retry finds it instead of
        adding one."""
        marker = self._run_marker()

        def existing() -> Any:
            return next((e for e in api.extras.journal_entries.filter(
                assigned_object_type=object_type, assigned_object_id=record.id, q=marker)
                if marker in (e.comments or "")), None)  # fmt: skip

        found = existing()
        if found is not None:
            return found.id, False
        info = activity.info()
        comments = (
            f"{text}\n\n"
            f"— Millwright workflow `{info.workflow_id}` run `{info.workflow_run_id}` "
            f"({info.activity_type})\n\n`{marker}`"
        )
        entry = self._write("journal", lambda: api.extras.journal_entries.create(
            assigned_object_type=object_type, assigned_object_id=record.id, kind=kind, comments=comments,
        ), existing)  # fmt: skip
        return entry.id, True

    # ------------------------------------------------------------ bootstrap

    @activity.defn
    async def bootstrap_section(self, req: BootstrapRequest) -> BootstrapSectionResult:
        """Create what one bootstrap section needs; report what was created and what already existed."""

        def run(api: Any) -> BootstrapSectionResult:
            result = BootstrapSectionResult(section=req.section)
            if req.section == "statuses":
                offered = {c["value"] for c in api.dcim.devices.choices().get("status", [])}
                missing = [s for s in DEVICE_STATUSES if s not in offered]
                if missing:
                    raise ApplicationError(
                        f"NetBox does not offer the device statuses {', '.join(missing)}; add them with "
                        "FIELD_CHOICES['dcim.Device.status+'] in NetBox's configuration",
                        type="NetBoxNotBootstrapped",
                        non_retryable=True,
                    )
                result.existing = [f"device status {s}" for s in DEVICE_STATUSES]
                return result
            for obj in BOOTSTRAP_SECTIONS[req.section]:
                app, name = obj.endpoint.split(".")
                endpoint = getattr(getattr(api, app), name)
                found = endpoint.get(**obj.key)
                if found is None:
                    self._create(obj.label, endpoint, {**obj.key, **obj.fields}, obj.key)
                    result.created.append(obj.label)
                    continue
                current = _rec(found)
                additions = {}
                for field in obj.ensure_contains:
                    have = list(current.get(field) or [])
                    want = [v for v in obj.fields.get(field, []) if v not in have]
                    if want:
                        additions[field] = have + want
                if additions:
                    self._update(obj.label, endpoint, found, additions, lambda fresh: all(
                        v in (_rec(fresh).get(k) or []) for k, vs in additions.items() for v in vs))
                    result.updated.append(f"{obj.label} ({', '.join(additions)})")
                else:
                    result.existing.append(obj.label)
            return result

        return await self._in_thread(f"bootstrapping {req.section}", run)

    # ------------------------------------------------------------ devices

    @activity.defn
    async def find_device(self, lookup: DeviceLookup) -> FoundDevice:
        """The device with this name, serial or asset tag; none found is an answer, not an error."""

        def run(api: Any) -> FoundDevice:
            record = self._find_device(api, lookup)
            return FoundDevice(device=device_info(record) if record is not None else None)

        return await self._in_thread(f"finding {lookup}", run)

    @activity.defn
    async def list_devices(self, query: DeviceQuery) -> list[DeviceInfo]:
        """Devices matching every given filter (role, site, status, tag, tenant)."""

        def run(api: Any) -> list[DeviceInfo]:
            filters = {k: v for k, v in query.model_dump(exclude={"limit"}).items() if v is not None}
            records = api.dcim.devices.filter(**filters) if filters else api.dcim.devices.all()
            out: list[DeviceInfo] = []
            for record in records:
                out.append(device_info(record))
                if len(out) >= query.limit:
                    break
            return out

        return await self._in_thread("listing devices", run)

    @activity.defn
    async def list_devices_page(self, query: DevicePageQuery) -> DevicePage:
        """One page of the devices matching every given filter (and, given `names`, with one of those names),
        ordered by ID from `after_id`: stable under concurrent changes, unlike offsets. Names go
        `NAMES_PER_REQUEST` to a request, so that no URL outgrows a front end's request-line limit."""

        def run(api: Any) -> DevicePage:
            filters = {k: v for k, v in query.model_dump(include={"role", "site", "status", "tag", "tenant"}).items()
                       if v is not None}  # fmt: skip
            chunks = [query.names[i:i + NAMES_PER_REQUEST] for i in range(0, len(query.names), NAMES_PER_REQUEST)]
            found: list[DeviceInfo] = []
            for names in chunks or (None,):
                wanted = {**filters, "id__gt": query.after_id, "ordering": "id", **({"name": names} if names else {})}
                for n, record in enumerate(api.dcim.devices.filter(**wanted, limit=query.limit + 1)):
                    found.append(device_info(record))
                    if n == query.limit:  # one more than a page: there is a next one
                        break
            found.sort(key=lambda d: d.id)
            page = found[:query.limit]
            return DevicePage(devices=page, next_after_id=page[-1].id if len(found) > query.limit else None)

        return await self._in_thread("listing a page of devices", run)

    @activity.defn
    async def set_device_status(self, req: SetStatusRequest) -> StatusChange:
        """Set a device's status and journal why and which workflow run did it (once, even across retries)."""

        def run(api: Any) -> StatusChange:
            device = self._resolve_device(api, req.device)
            previous = _value(_rec(device).get("status"))
            changed = previous != req.status
            if changed:  # NetBox validates the choice: 400 → non-retryable
                self._update("status", api.dcim.devices, device, {"status": req.status})
                text = f"Status **{previous}** → **{req.status}**: {req.reason}"
            else:
                text = f"Status **{req.status}** (already set when this attempt read it): {req.reason}"
            entry_id, created = self._ensure_journal(api, device, req.kind, text)
            return StatusChange(
                device=device.name or f"#{device.id}", previous=previous, status=req.status, changed=changed,
                journal_entry_id=entry_id, journal_created=created,
            )  # fmt: skip

        return await self._in_thread(f"setting the status of {req.device} to {req.status!r}", run)

    @activity.defn
    async def set_device_tags(self, req: DeviceTagsRequest) -> DeviceTags:
        """Add and remove tags on a device; writes only when its tag set changes."""

        def run(api: Any) -> DeviceTags:
            device = self._resolve_device(api, req.device)
            have = [t["slug"] if isinstance(t, dict) else t.slug for t in (_rec(device).get("tags") or [])]
            want = sorted((set(have) | set(req.add)) - set(req.remove))
            changed = want != sorted(have)
            if changed:
                missing = [t for t in req.add if t not in have and api.extras.tags.get(slug=t) is None]
                if missing:
                    raise not_bootstrapped(f"the tag(s) {', '.join(missing)}")
                self._update("tags", api.dcim.devices, device, {"tags": [{"slug": t} for t in want]}, lambda fresh:
                             sorted(t["slug"] for t in _rec(fresh).get("tags") or []) == want)  # fmt: skip
            return DeviceTags(device=device.name or f"#{device.id}", tags=want, changed=changed)

        return await self._in_thread(f"tagging {req.device}", run)

    @activity.defn
    async def record_burnin(self, req: BurnInRecord) -> BurnInRecorded:
        """Store the burn-in result, time and report link in custom fields, and journal the summary."""

        def run(api: Any) -> BurnInRecorded:
            device = self._resolve_device(api, req.device)
            have = _rec(device).get("custom_fields") or {}
            want = {
                CF_BURNIN_RESULT: req.result,
                CF_BURNIN_AT: req.finished_at.isoformat(),
                CF_BURNIN_REPORT: req.report_url,
            }
            if CF_BURNIN_RESULT not in have:
                raise not_bootstrapped(f"the custom field {CF_BURNIN_RESULT}")
            changed = [k for k, v in want.items() if not _same_cf(have.get(k), v)]
            if changed:
                self._update("burn-in fields", api.dcim.devices, device,
                             {"custom_fields": {k: want[k] for k in changed}})  # fmt: skip
            kind = {"passed": "success", "failed": "danger", "aborted": "warning"}[req.result]
            lines = [f"Burn-in **{req.result}** at {req.finished_at.isoformat()}", "", req.summary]
            if req.report_url:
                lines += ["", f"Report: {req.report_url}"]
            entry_id, created = self._ensure_journal(api, device, kind, "\n".join(lines))
            return BurnInRecorded(
                device=device.name or f"#{device.id}", updated_fields=changed, journal_entry_id=entry_id,
                journal_created=created,
            )  # fmt: skip

        return await self._in_thread(f"recording the burn-in of {req.device}", run)

    @activity.defn
    async def record_gpus(self, req: GpuInventory) -> UpsertResult:
        """GPUs as inventory items GPU<index> (role GPU, NVIDIA): model, serial, UUID, firmware, PCI bus ID."""

        def run(api: Any) -> UpsertResult:
            device = self._resolve_device(api, req.device)
            role = api.dcim.inventory_item_roles.get(slug=GPU_ITEM_ROLE)
            maker = api.dcim.manufacturers.get(slug=NVIDIA)
            if role is None or maker is None:
                raise not_bootstrapped(f"the inventory item role {GPU_ITEM_ROLE!r} or manufacturer {NVIDIA!r}")
            items = {i.name: i for i in api.dcim.inventory_items.filter(device_id=device.id, role=GPU_ITEM_ROLE)}
            result = UpsertResult()
            for gpu in req.gpus:
                want = {
                    "part_id": gpu.model,
                    "serial": gpu.serial,
                    "description": f"PCI {gpu.pci_bus_id}" if gpu.pci_bus_id else "",
                    "custom_fields": {CF_GPU_UUID: gpu.uuid or None, CF_FIRMWARE: gpu.firmware or None},
                }
                item = items.get(gpu.item_name)
                if item is None:
                    self._create(gpu.item_name, api.dcim.inventory_items, {
                        "device": device.id, "name": gpu.item_name, "role": role.id, "manufacturer": maker.id,
                        "discovered": True, **want}, {"device_id": device.id, "name": gpu.item_name})  # fmt: skip
                    result.created.append(gpu.item_name)
                    continue
                diff = _diff(_rec(item), want)
                if diff:
                    self._update(gpu.item_name, api.dcim.inventory_items, item, diff)
                    result.updated.append(gpu.item_name)
                else:
                    result.unchanged.append(gpu.item_name)
            return result

        return await self._in_thread(f"recording the GPUs of {req.device}", run)

    @activity.defn
    async def record_interfaces(self, req: InterfaceInventory) -> UpsertResult:
        """Interfaces by name, with type, MAC, description and InfiniBand port GUID (a custom field)."""

        def run(api: Any) -> UpsertResult:
            device = self._resolve_device(api, req.device)
            have = {i.name: i for i in api.dcim.interfaces.filter(device_id=device.id)}
            result = UpsertResult()
            for iface in req.interfaces:
                want: dict[str, Any] = {"type": iface.type, "description": iface.description}
                if iface.port_guid is not None:
                    want["custom_fields"] = {CF_IB_PORT_GUID: iface.port_guid.lower()}
                record = have.get(iface.name)
                if record is None:
                    record = self._create(iface.name, api.dcim.interfaces, {"device": device.id, "name": iface.name,
                                          **want}, {"device_id": device.id, "name": iface.name})  # fmt: skip
                    result.created.append(iface.name)
                else:
                    diff = _diff(_rec(record), want)
                    if diff:
                        self._update(iface.name, api.dcim.interfaces, record, diff)
                        result.updated.append(iface.name)
                    else:
                        result.unchanged.append(iface.name)
                if iface.mac_address:
                    self._ensure_mac(api, record, iface.mac_address)
            return result

        return await self._in_thread(f"recording the interfaces of {req.device}", run)

    def _ensure_mac(self, api: Any, interface: Any, mac: str) -> None:
        """NetBox 4.2+ keeps MACs as objects assigned to interfaces; one per (interface, address)."""

        def found() -> Any:
            return next((m for m in api.dcim.mac_addresses.filter(assigned_object_type="dcim.interface",
                                                                  assigned_object_id=interface.id)
                         if str(m.mac_address).lower() == mac.lower()), None)  # fmt: skip

        if found() is None:
            self._write(f"mac {mac}", lambda: api.dcim.mac_addresses.create(
                mac_address=mac, assigned_object_type="dcim.interface", assigned_object_id=interface.id), found)

    # ------------------------------------------------------------ tenants and clusters

    @activity.defn
    async def upsert_tenant(self, spec: TenantSpec) -> ObjectResult:
        """Create the tenant (by slug) or update its name, description and PKey."""

        def run(api: Any) -> ObjectResult:
            want: dict[str, Any] = {"name": spec.name, "description": spec.description}
            if spec.pkey is not None:
                want["custom_fields"] = {CF_TENANT_PKEY: spec.pkey.lower()}
            return self._upsert(api.tenancy.tenants, {"slug": spec.slug}, want)

        return await self._in_thread(f"upserting tenant {spec.slug}", run)

    @activity.defn
    async def upsert_cluster(self, spec: ClusterSpec) -> ObjectResult:
        """Create the cluster (by name) or update its type, tenant, status and description."""

        def run(api: Any) -> ObjectResult:
            ctype = api.virtualization.cluster_types.get(slug=spec.type)
            if ctype is None:
                raise not_bootstrapped(f"the cluster type {spec.type!r}")
            tenant = None
            if spec.tenant:
                tenant = api.tenancy.tenants.get(slug=spec.tenant)
                if tenant is None:
                    raise ApplicationError(f"no tenant {spec.tenant!r} in NetBox", type="TenantNotFound",
                                           non_retryable=True)  # fmt: skip
            want = {"type": ctype.id, "tenant": tenant.id if tenant else None, "status": spec.status,
                    "description": spec.description}  # fmt: skip
            return self._upsert(api.virtualization.clusters, {"name": spec.name}, want)

        return await self._in_thread(f"upserting cluster {spec.name}", run)

    @activity.defn
    async def assign_devices_to_cluster(self, req: ClusterAssignment) -> AssignmentResult:
        """Point each device's cluster at this cluster; devices already in it are left alone; with `missing_ok`,
        devices NetBox does not know are listed in `missing` instead of failing the activity."""

        def run(api: Any) -> AssignmentResult:
            cluster = api.virtualization.clusters.get(name=req.cluster)
            if cluster is None:
                raise ApplicationError(f"no cluster {req.cluster!r} in NetBox", type="ClusterNotFound",
                                       non_retryable=True)  # fmt: skip
            result = AssignmentResult(cluster=req.cluster)
            for lookup in req.devices:
                device = self._find_device(api, lookup) if req.missing_ok else self._resolve_device(api, lookup)
                if device is None:
                    result.missing.append(lookup.name or lookup.serial or lookup.asset_tag or str(lookup))
                    continue
                name = device.name or f"#{device.id}"
                if (_rec(device).get("cluster") or {}).get("id") == cluster.id:
                    result.already.append(name)
                    continue
                self._update(name, api.dcim.devices, device, {"cluster": cluster.id})
                result.assigned.append(name)
            return result

        return await self._in_thread(f"assigning devices to cluster {req.cluster}", run)


    # ------------------------------------------------------------ InfiniBand

    @activity.defn
    async def list_ib_ports(self, query: IbPortQuery) -> list[DeviceIbPorts]:
        """Each device's interfaces that carry an InfiniBand port GUID (the custom field), GUIDs lowercased."""

        def run(api: Any) -> list[DeviceIbPorts]:
            out: list[DeviceIbPorts] = []
            for name in query.devices:
                device = self._find_device(api, DeviceLookup(name=name))
                if device is None:
                    out.append(DeviceIbPorts(device=name, found=False))
                    continue
                ports = []
                for iface in api.dcim.interfaces.filter(device_id=device.id):
                    guid = (_rec(iface).get("custom_fields") or {}).get(CF_IB_PORT_GUID)
                    if guid:
                        ports.append(IbPort(interface=iface.name, guid=str(guid).lower().removeprefix("0x")))
                out.append(DeviceIbPorts(device=name, found=True, ports=ports))
            return out

        return await self._in_thread("listing InfiniBand port GUIDs", run)

    @activity.defn
    async def record_tenant_pkey(self, req: TenantPKeyRecord) -> ObjectResult:
        """Set the tenant's PKey custom field and journal its members (one entry per activity, retry-safe)."""

        def run(api: Any) -> ObjectResult:
            tenant = api.tenancy.tenants.get(slug=req.tenant)
            if tenant is None:
                if not req.name:
                    raise ApplicationError(f"no tenant {req.tenant!r} in NetBox", type="TenantNotFound",
                                           non_retryable=True)  # fmt: skip
                tenant = self._create(req.tenant, api.tenancy.tenants, {"name": req.name, "slug": req.tenant},
                                      {"slug": req.tenant})  # fmt: skip
            have = _rec(tenant).get("custom_fields") or {}
            if CF_TENANT_PKEY not in have:
                raise not_bootstrapped(f"the custom field {CF_TENANT_PKEY}")
            changed = []
            if not _same_cf(have.get(CF_TENANT_PKEY), req.pkey):
                self._update("pkey", api.tenancy.tenants, tenant, {"custom_fields": {CF_TENANT_PKEY: req.pkey}})
                changed.append(CF_TENANT_PKEY)
            if req.pkey:
                lines = [f"InfiniBand PKey **{req.pkey}** on fabric `{req.fabric}`, members:"]
                lines += [f"- {h}: {', '.join(g)}" for h, g in sorted(req.members.items())]
            else:
                lines = [f"InfiniBand partition on fabric `{req.fabric}` released"]
            self._ensure_journal(api, tenant, "info", "\n".join(lines), object_type="tenancy.tenant")
            return ObjectResult(id=tenant.id, name=req.tenant, created=False, updated=changed)

        return await self._in_thread(f"recording the PKey of tenant {req.tenant}", run)


# ---------------------------------------------------------------- comparison helpers


def _same_cf(have: Any, want: Any) -> bool:
    if isinstance(have, dict) and "value" in have:  # a select field reads back as {"value", "label"}
        have = have["value"]
    if isinstance(have, str) and isinstance(want, str):
        # NetBox normalizes datetimes (e.g. 'Z' vs '+00:00'); compare the instants.
        try:
            return datetime.fromisoformat(have.replace("Z", "+00:00")) == datetime.fromisoformat(want.replace("Z", "+00:00"))
        except ValueError:
            return have == want
    return have == want


def _diff(current: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """The fields of `want` that differ from the record (nested objects compared by id or value)."""
    out: dict[str, Any] = {}
    for key, value in want.items():
        have = current.get(key)
        if key == "custom_fields":
            have_cf = have or {}
            changed = {k: v for k, v in value.items() if not _same_cf(have_cf.get(k), v)}
            if changed:
                out[key] = changed
            continue
        if isinstance(have, dict):
            have = have.get("id", have.get("value"))
        if (have or None) != (value or None):
            out[key] = value
    return out
