"""Every inventory activity against the real NetBox, run through a real worker and workflow."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, RetryState

from activities.netbox.models import (
    CF_BURNIN_AT,
    CF_BURNIN_REPORT,
    CF_BURNIN_RESULT,
    CF_GPU_UUID,
    CF_IB_PORT_GUID,
    TAG_QUARANTINE,
)


@pytest.fixture(scope="module")
def fleet(nb, bootstrapped):
    """A site, a device type and four GPU servers (one tagged, one with a duplicate serial)."""
    suffix = uuid.uuid4().hex[:6]
    site = nb.dcim.sites.create(name=f"hall-{suffix}", slug=f"hall-{suffix}", status="active")
    other = nb.dcim.sites.create(name=f"annex-{suffix}", slug=f"annex-{suffix}", status="active")
    maker = nb.dcim.manufacturers.get(slug="nvidia")
    dtype = nb.dcim.device_types.create(manufacturer=maker.id, model=f"HGX H200 {suffix}", slug=f"hgx-h200-{suffix}")
    role = nb.dcim.device_roles.get(slug="gpu-server")
    tenant = nb.tenancy.tenants.create(name=f"acme-{suffix}", slug=f"acme-{suffix}")
    devices = {}
    for i, (where, serial) in enumerate([(site, "S-1"), (site, "S-2"), (site, "S-DUP"), (other, "S-DUP")], start=1):
        devices[i] = nb.dcim.devices.create(
            name=f"gpu-{suffix}-{i:02d}", site=where.id, role=role.id, device_type=dtype.id, status="planned",
            serial=f"{serial}-{suffix}" if serial != "S-DUP" else f"S-DUP-{suffix}", asset_tag=f"AT-{suffix}-{i}",
            tenant=tenant.id if i == 2 else None, tags=[{"slug": TAG_QUARANTINE}] if i == 3 else [],
        )  # fmt: skip
    return {"site": site.slug, "other": other.slug, "tenant": tenant.slug, "suffix": suffix, "devices": devices}


def journal(nb, device_id: int) -> list:
    return list(nb.extras.journal_entries.filter(assigned_object_type="dcim.device", assigned_object_id=device_id))


def failure_of(err: WorkflowFailureError) -> tuple[ActivityError, ApplicationError]:
    activity_error = err.cause
    assert isinstance(activity_error, ActivityError), err
    assert isinstance(activity_error.cause, ApplicationError), activity_error
    return activity_error, activity_error.cause


async def test_find_device_by_name_serial_and_asset_tag(call, fleet):
    d1 = fleet["devices"][1]
    by_name = await call("find_device", {"name": d1.name})
    by_serial = await call("find_device", {"serial": d1.serial})
    by_tag = await call("find_device", {"asset_tag": d1.asset_tag})
    assert by_name["device"]["id"] == by_serial["device"]["id"] == by_tag["device"]["id"] == d1.id
    assert by_name["device"]["status"] == "planned" and by_name["device"]["role"] == "gpu-server"
    assert by_name["device"]["site"] == fleet["site"]
    assert (await call("find_device", {"name": "no-such-device"}))["device"] is None

    # Serials are not unique in NetBox: two matches are an error, never a guess.
    with pytest.raises(WorkflowFailureError) as failed:
        await call("find_device", {"serial": f"S-DUP-{fleet['suffix']}"})
    activity_error, cause = failure_of(failed.value)
    assert cause.type == "AmbiguousDevice" and activity_error.retry_state == RetryState.NON_RETRYABLE_FAILURE
    # ...unless the site tells them apart.
    one = await call("find_device", {"serial": f"S-DUP-{fleet['suffix']}", "site": fleet["other"]})
    assert one["device"]["id"] == fleet["devices"][4].id


async def test_list_devices_by_role_site_status_tag_tenant(call, fleet):
    ids = {i: d.id for i, d in fleet["devices"].items()}

    async def listed(**query) -> set[int]:
        return {d["id"] for d in await call("list_devices", query)}

    assert await listed(site=fleet["site"]) == {ids[1], ids[2], ids[3]}
    assert await listed(role="gpu-server", site=fleet["other"]) == {ids[4]}
    assert await listed(tag=TAG_QUARANTINE) >= {ids[3]} and ids[1] not in await listed(tag=TAG_QUARANTINE)
    assert await listed(tenant=fleet["tenant"]) == {ids[2]}
    assert await listed(site=fleet["site"], status="planned") == {ids[1], ids[2], ids[3]}
    assert await listed(site=fleet["site"], status="failed") == set()


async def test_list_devices_page_by_page_and_by_name(call, fleet):
    """A fleet read in pages ordered by ID: every device once, whatever the page size; names filter too."""
    ids = sorted(d.id for d in fleet["devices"].values())
    names = {d.id: d.name for d in fleet["devices"].values()}
    seen: list[int] = []
    after, pages = 0, 0
    while after is not None:
        page = await call("list_devices_page", {"role": "gpu-server", "after_id": after, "limit": 1,
                                                "names": [names[i] for i in ids]})  # fmt: skip
        seen += [d["id"] for d in page["devices"]]
        after, pages = page["next_after_id"], pages + 1
    assert seen == ids and pages == len(ids)  # each page reads one device more: the last one knows it is last
    two = await call("list_devices_page", {"site": fleet["site"], "limit": 2})
    assert [d["id"] for d in two["devices"]] == ids[:2] and two["next_after_id"] == ids[1]
    rest = await call("list_devices_page", {"site": fleet["site"], "after_id": ids[1], "limit": 2})
    assert [d["id"] for d in rest["devices"]] == [ids[2]] and rest["next_after_id"] is None
    # More names than one request carries (NAMES_PER_REQUEST): asked in parts, answered as one page.
    many = [f"absent-{i}" for i in range(120)] + [names[ids[3]]]
    assert [d["id"] for d in (await call("list_devices_page", {"names": many}))["devices"]] == [ids[3]]


async def test_set_status_journals_why_and_which_run(call, fleet, nb):
    device = fleet["devices"][1]
    before = len(journal(nb, device.id))
    done = await call(
        "set_device_status",
        {"device": {"name": device.name}, "status": "failed", "reason": "Xid 79 on GPU3", "kind": "danger"},
    )
    assert done["previous"] == "planned" and done["status"] == "failed" and done["changed"] and done["journal_created"]
    assert nb.dcim.devices.get(device.id).status.value == "failed"
    entries = journal(nb, device.id)
    assert len(entries) == before + 1
    entry = nb.extras.journal_entries.get(done["journal_entry_id"])
    handle = call.handles[-1]
    assert "planned" in entry.comments and "failed" in entry.comments and "Xid 79 on GPU3" in entry.comments
    assert handle.id in entry.comments and entry.kind.value == "danger"

    # Asked again: nothing to change, still one journal entry per decision.
    again = await call("set_device_status", {"device": {"name": device.name}, "status": "failed", "reason": "re-check"})
    assert again["changed"] is False and again["previous"] == "failed"


async def test_a_retry_after_a_crash_does_not_duplicate_the_journal_entry(call, fleet, nb, netbox_faults):
    device = fleet["devices"][2]
    before = len(journal(nb, device.id))

    # Attempt 1 writes the status and the journal entry, then dies; attempt 2 finds both done.
    netbox_faults.crash_after.add("journal")
    done = await call("set_device_status", {"device": {"name": device.name}, "status": "staged", "reason": "racked"})
    assert netbox_faults.crashes == ["journal"]
    assert done["journal_created"] is False  # the retry found the entry attempt 1 wrote
    assert len(journal(nb, device.id)) == before + 1
    history = await call.handles[-1].fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert attempts == [2]  # the history records only the final attempt's start, which is the retry

    # Crash between the status write and the journal write: one entry, written by the retry.
    netbox_faults.crashes.clear()
    netbox_faults.crash_after.clear()
    netbox_faults.crash_after.add("status")
    done = await call(
        "set_device_status", {"device": {"name": device.name}, "status": "active", "reason": "burn-in ok"}
    )
    assert netbox_faults.crashes == ["status"]
    assert done["journal_created"] is True and done["changed"] is False
    assert nb.dcim.devices.get(device.id).status.value == "active"
    assert len(journal(nb, device.id)) == before + 2


async def test_a_rejected_status_is_a_non_retryable_error_with_netbox_message(call, fleet, nb):
    device = fleet["devices"][3]
    before = len(journal(nb, device.id))
    with pytest.raises(WorkflowFailureError) as failed:
        await call("set_device_status", {"device": {"name": device.name}, "status": "burning", "reason": "typo"})
    activity_error, cause = failure_of(failed.value)
    assert cause.type == "NetBoxRejected" and cause.non_retryable
    assert activity_error.retry_state == RetryState.NON_RETRYABLE_FAILURE
    assert "400" in cause.message and "burning" in cause.message and "is not a valid choice" in cause.message
    assert nb.dcim.devices.get(device.id).status.value == "planned"
    assert len(journal(nb, device.id)) == before  # nothing journalled for a change that did not happen


async def test_record_burnin_sets_custom_fields_and_journals_the_summary(call, fleet, nb):
    device = fleet["devices"][1]
    record = {
        "device": {"asset_tag": device.asset_tag},
        "result": "passed",
        "finished_at": "2026-03-01T12:00:00Z",
        "report_url": "https://reports.example.com/burnin/1",
        "summary": "8/8 GPUs passed dcgmi diag -r 3; NCCL all-reduce 480 GB/s",
    }
    done = await call("record_burnin", record)
    assert set(done["updated_fields"]) == {CF_BURNIN_RESULT, CF_BURNIN_AT, CF_BURNIN_REPORT}
    cf = nb.dcim.devices.get(device.id).custom_fields
    assert cf[CF_BURNIN_RESULT]["value"] == "passed" and cf[CF_BURNIN_REPORT].endswith("/burnin/1")
    assert cf[CF_BURNIN_AT].startswith("2026-03-01T12:00:00")
    entry = nb.extras.journal_entries.get(done["journal_entry_id"])
    assert "NCCL all-reduce" in entry.comments and entry.kind.value == "success"

    again = await call("record_burnin", record)
    assert again["updated_fields"] == []

    # The URL custom field's validation is NetBox's: a dangerous scheme is rejected.
    with pytest.raises(WorkflowFailureError) as failed:
        await call("record_burnin", {**record, "report_url": "javascript:alert(1)"})
    _, cause = failure_of(failed.value)
    assert cause.type == "NetBoxRejected" and CF_BURNIN_REPORT in cause.message


async def test_record_gpus_as_inventory_items(call, fleet, nb):
    device = fleet["devices"][1]
    gpus = [
        {"index": i, "model": "H200-SXM5-141GB", "serial": f"16500000{i}", "uuid": f"GPU-{i:08d}-aaaa",
         "firmware": "96.00.A5.00.01", "pci_bus_id": f"0000:{0x18 + i:02x}:00.0"}
        for i in range(8)
    ]  # fmt: skip
    done = await call("record_gpus", {"device": {"name": device.name}, "gpus": gpus})
    assert sorted(done["created"]) == sorted(f"GPU{i}" for i in range(8))
    items = {i.name: i for i in nb.dcim.inventory_items.filter(device_id=device.id)}
    assert items["GPU3"].serial == "165000003" and items["GPU3"].part_id == "H200-SXM5-141GB"
    assert items["GPU3"].custom_fields[CF_GPU_UUID] == "GPU-00000003-aaaa" and items["GPU3"].role.slug == "gpu"

    gpus[3]["serial"] = "999"  # GPU3 was swapped
    again = await call("record_gpus", {"device": {"name": device.name}, "gpus": gpus})
    assert again["created"] == [] and again["updated"] == ["GPU3"] and len(again["unchanged"]) == 7
    assert nb.dcim.inventory_items.get(device_id=device.id, name="GPU3").serial == "999"


async def test_record_interfaces_with_infiniband_port_guids(call, fleet, nb):
    device = fleet["devices"][1]
    ifaces = [
        {"name": f"ibp{i}s0", "type": "infiniband-ndr", "port_guid": f"0x9c63c00300{i:06x}", "mac_address": None}
        for i in range(4)
    ]
    done = await call("record_interfaces", {"device": {"name": device.name}, "interfaces": ifaces})
    assert len(done["created"]) == 4
    ib0 = nb.dcim.interfaces.get(device_id=device.id, name="ibp0s0")
    assert ib0.type.value == "infiniband-ndr" and ib0.custom_fields[CF_IB_PORT_GUID] == "0x9c63c00300000000"

    again = await call("record_interfaces", {"device": {"name": device.name}, "interfaces": ifaces})
    assert again["created"] == [] and again["updated"] == [] and len(again["unchanged"]) == 4

    eth = [{"name": "eth0", "type": "100gbase-x-qsfp28", "mac_address": "9c:63:c0:00:00:01"}]
    await call("record_interfaces", {"device": {"name": device.name}, "interfaces": eth})
    await call("record_interfaces", {"device": {"name": device.name}, "interfaces": eth})
    eth0 = nb.dcim.interfaces.get(device_id=device.id, name="eth0")
    assert [str(m.mac_address).lower() for m in nb.dcim.mac_addresses.filter(assigned_object_id=eth0.id)] == [
        "9c:63:c0:00:00:01"
    ]

    # The GUID custom field's validation regex is NetBox's to enforce.
    with pytest.raises(WorkflowFailureError) as failed:
        await call("record_interfaces", {"device": {"name": device.name},
                                         "interfaces": [{"name": "ibp9s0", "port_guid": "not-a-guid"}]})  # fmt: skip
    _, cause = failure_of(failed.value)
    assert cause.type == "NetBoxRejected" and CF_IB_PORT_GUID in cause.message


async def test_tenant_cluster_and_assignment(call, fleet, nb):
    slug = f"tenant-{fleet['suffix']}"
    made = await call("upsert_tenant", {"name": "Tenant One", "slug": slug, "pkey": "0x8001"})
    assert made["created"]
    same = await call("upsert_tenant", {"name": "Tenant One", "slug": slug, "pkey": "0x8001"})
    assert not same["created"] and same["updated"] == [] and same["id"] == made["id"]
    renamed = await call("upsert_tenant", {"name": "Tenant 1", "slug": slug, "pkey": "0x8002"})
    assert renamed["updated"] == ["custom_fields", "name"]
    assert nb.tenancy.tenants.get(slug=slug).custom_fields["millwright_pkey"] == "0x8002"

    cluster = f"train-{fleet['suffix']}"
    c = await call("upsert_cluster", {"name": cluster, "tenant": slug})
    assert c["created"]
    assert (await call("upsert_cluster", {"name": cluster, "tenant": slug}))["updated"] == []
    assert nb.virtualization.clusters.get(name=cluster).tenant.slug == slug

    devices = [{"name": fleet["devices"][1].name}, {"name": fleet["devices"][2].name}]
    first = await call("assign_devices_to_cluster", {"cluster": cluster, "devices": devices})
    assert sorted(first["assigned"]) == sorted(d["name"] for d in devices) and first["already"] == []
    second = await call("assign_devices_to_cluster", {"cluster": cluster, "devices": devices})
    assert second["assigned"] == [] and len(second["already"]) == 2
    assert nb.dcim.devices.get(fleet["devices"][1].id).cluster.name == cluster

    with pytest.raises(WorkflowFailureError) as failed:
        await call("upsert_tenant", {"name": "Bad", "slug": f"bad-{fleet['suffix']}", "pkey": "0xZZZZ"})
    _, cause = failure_of(failed.value)
    assert cause.type == "NetBoxRejected" and "millwright_pkey" in cause.message
