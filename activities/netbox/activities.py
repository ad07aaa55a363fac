"""Inventory activities against NetBox, the source of truth for devices, tenants and clusters.

Each activity does one thing and is safe to retry after a crash at any line: it reads
first and writes only the difference, looking objects up by a stable key (device name,
serial or asset tag; slugs; (device, name) for interfaces and inventory items). Journal
entries carry a marker naming the workflow run and activity that wrote them, and are
only created when no entry with that marker exists, so a retry never duplicates one.
A write whose answer is lost (the connection dropped or timed out after sending, a
gateway's 5xx) is read back at once (`NetBoxClient._write`, activities/netbox/client.py): when it landed, the
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
``TlsVerificationFailed`` naming those settings (activities/support/tls.py).

The API token is read from a secret reference (`activities.support.secrets.SecretRef`) inside the
activity, at each attempt; it never appears in an activity's input, output or error.
pynetbox is synchronous: calls run in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.netbox.bootstrap import BOOTSTRAP_SECTIONS, BootstrapRequest, BootstrapSectionResult
from activities.netbox.client import (
    NetBoxClient,
    device_info,
    field_value,
    fields_diff,
    record_fields,
    same_custom_field,
)
from activities.netbox.errors import not_bootstrapped
from activities.netbox.models import (
    CF_BURNIN_AT,
    CF_BURNIN_REPORT,
    CF_BURNIN_RESULT,
    CF_FIRMWARE,
    CF_FIRMWARE_INSTALLED,
    CF_GPU_UUID,
    CF_IB_PORT_GUID,
    CF_TENANT_PKEY,
    DEVICE_STATUSES,
    GPU_ITEM_ROLE,
    NAMES_PER_REQUEST,
    NVIDIA,
    AssignmentResult,
    BurnInRecord,
    BurnInRecorded,
    ClusterAssignment,
    ClusterSpec,
    DeviceIbPorts,
    DeviceInfo,
    DeviceLookup,
    DevicePage,
    DevicePageQuery,
    DeviceQuery,
    DeviceRecorded,
    DeviceTags,
    DeviceTagsRequest,
    FirmwareRecord,
    FoundDevice,
    GpuInventory,
    IbPort,
    IbPortQuery,
    InterfaceInventory,
    ObjectResult,
    SetStatusRequest,
    StatusChange,
    TenantJournal,
    TenantPKeyRecord,
    TenantSpec,
    UpsertResult,
)


class NetBoxActivities(NetBoxClient):
    """NetBox inventory activities. With no config every activity fails with NetBoxNotConfigured."""

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
                current = record_fields(found)
                additions = {}
                for field in obj.ensure_contains:
                    have = list(current.get(field) or [])
                    want = [v for v in obj.fields.get(field, []) if v not in have]
                    if want:
                        additions[field] = have + want
                if additions:
                    self._update(
                        obj.label,
                        endpoint,
                        found,
                        additions,
                        lambda fresh: all(
                            v in (record_fields(fresh).get(k) or []) for k, vs in additions.items() for v in vs
                        ),
                    )
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
            chunks = [query.names[i : i + NAMES_PER_REQUEST] for i in range(0, len(query.names), NAMES_PER_REQUEST)]
            found: list[DeviceInfo] = []
            for names in chunks or (None,):
                wanted = {**filters, "id__gt": query.after_id, "ordering": "id", **({"name": names} if names else {})}
                for n, record in enumerate(api.dcim.devices.filter(**wanted, limit=query.limit + 1)):
                    found.append(device_info(record))
                    if n == query.limit:  # one more than a page: there is a next one
                        break
            found.sort(key=lambda d: d.id)
            page = found[: query.limit]
            return DevicePage(devices=page, next_after_id=page[-1].id if len(found) > query.limit else None)

        return await self._in_thread("listing a page of devices", run)

    @activity.defn
    async def set_device_status(self, req: SetStatusRequest) -> StatusChange:
        """Set a device's status and journal why and which workflow run did it (once, even across retries)."""

        def run(api: Any) -> StatusChange:
            device = self._resolve_device(api, req.device)
            previous = field_value(record_fields(device).get("status"))
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
            have = [t["slug"] if isinstance(t, dict) else t.slug for t in (record_fields(device).get("tags") or [])]
            want = sorted((set(have) | set(req.add)) - set(req.remove))
            changed = want != sorted(have)
            if changed:
                missing = [t for t in req.add if t not in have and api.extras.tags.get(slug=t) is None]
                if missing:
                    raise not_bootstrapped(f"the tag(s) {', '.join(missing)}")
                self._update("tags", api.dcim.devices, device, {"tags": [{"slug": t} for t in want]}, lambda fresh:
                             sorted(t["slug"] for t in record_fields(fresh).get("tags") or []) == want)  # fmt: skip
            return DeviceTags(device=device.name or f"#{device.id}", tags=want, changed=changed)

        return await self._in_thread(f"tagging {req.device}", run)

    @activity.defn
    async def record_burnin(self, req: BurnInRecord) -> BurnInRecorded:
        """Store the burn-in result, time and report link in custom fields, and journal the summary."""

        def run(api: Any) -> BurnInRecorded:
            device = self._resolve_device(api, req.device)
            have = record_fields(device).get("custom_fields") or {}
            want = {
                CF_BURNIN_RESULT: req.result,
                CF_BURNIN_AT: req.finished_at.isoformat(),
                CF_BURNIN_REPORT: req.report_url,
            }
            if CF_BURNIN_RESULT not in have:
                raise not_bootstrapped(f"the custom field {CF_BURNIN_RESULT}")
            changed = [k for k, v in want.items() if not same_custom_field(have.get(k), v)]
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
    async def record_firmware(self, req: FirmwareRecord) -> DeviceRecorded:
        """Store the firmware versions a firmware update read back in a custom field, and journal its summary."""

        def run(api: Any) -> DeviceRecorded:
            device = self._resolve_device(api, req.device)
            have = record_fields(device).get("custom_fields") or {}
            if CF_FIRMWARE_INSTALLED not in have:
                raise not_bootstrapped(f"the custom field {CF_FIRMWARE_INSTALLED}")
            changed = []
            if req.versions and not same_custom_field(have.get(CF_FIRMWARE_INSTALLED), req.versions):
                self._update("firmware field", api.dcim.devices, device,
                             {"custom_fields": {CF_FIRMWARE_INSTALLED: req.versions}})  # fmt: skip
                changed.append(CF_FIRMWARE_INSTALLED)
            kind = {"updated": "success", "up-to-date": "info", "failed": "danger"}[req.result]
            text = f"Firmware bundle {req.bundle}: **{req.result}**\n\n{req.summary}"
            entry_id, created = self._ensure_journal(api, device, kind, text)
            return DeviceRecorded(device=device.name or f"#{device.id}", updated_fields=changed,
                                  journal_entry_id=entry_id, journal_created=created)  # fmt: skip

        return await self._in_thread(f"recording the firmware of {req.device}", run)

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
                diff = fields_diff(record_fields(item), want)
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
                    diff = fields_diff(record_fields(record), want)
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
            self._write(
                f"mac {mac}",
                lambda: api.dcim.mac_addresses.create(
                    mac_address=mac, assigned_object_type="dcim.interface", assigned_object_id=interface.id
                ),
                found,
            )

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
                if (record_fields(device).get("cluster") or {}).get("id") == cluster.id:
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
                    guid = (record_fields(iface).get("custom_fields") or {}).get(CF_IB_PORT_GUID)
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
            have = record_fields(tenant).get("custom_fields") or {}
            if CF_TENANT_PKEY not in have:
                raise not_bootstrapped(f"the custom field {CF_TENANT_PKEY}")
            changed = []
            if not same_custom_field(have.get(CF_TENANT_PKEY), req.pkey):
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

    @activity.defn
    async def journal_tenant(self, req: TenantJournal) -> int:
        """Journal this on the tenant (once per activity, retry-safe); returns the entry's ID."""

        def run(api: Any) -> int:
            tenant = api.tenancy.tenants.get(slug=req.tenant)
            if tenant is None:
                raise ApplicationError(f"no tenant {req.tenant!r} in NetBox", type="TenantNotFound",
                                       non_retryable=True)  # fmt: skip
            return self._ensure_journal(api, tenant, req.kind, req.text, object_type="tenancy.tenant")[0]

        return await self._in_thread(f"journaling on tenant {req.tenant}", run)
