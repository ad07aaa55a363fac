"""The real sushy client against the lab's HGX BMC emulator (lab/redfish.py)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import sushy
from sushy import exceptions as sushy_exc

from lab.bmc import DEFAULT_BIOS, DEFAULT_FIRMWARE, fleet_servers, normalize_spec
from lab.redfish import LabBmcs
from tests.activities.redfish.conftest import BMC_PASSWORD, BMC_USER

AUTH = (BMC_USER, BMC_PASSWORD)
SYSTEM = "/redfish/v1/Systems/1"


async def until(probe, timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last: {value!r})")
        await asyncio.sleep(0.05)


def power(root) -> sushy.PowerState:
    return root.get_system(SYSTEM).power_state


def sel(url: str, system) -> tuple[list[dict], dict]:
    """SEL entries the way a client finds them: System -> LogServices -> SEL -> Entries, plain HTTP."""
    with httpx.Client(base_url=url, auth=AUTH) as c:
        services = c.get(system.json["LogServices"]["@odata.id"]).json()["Members"]
        service = next(c.get(m["@odata.id"]).json() for m in services if m["@odata.id"].endswith("/SEL"))
        return c.get(service["Entries"]["@odata.id"]).json()["Members"], service


def rf_error(resp: httpx.Response, status: int, message_id: str) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == "Base.1.15.GeneralError" and err["message"]
    assert err["@Message.ExtendedInfo"][0]["MessageId"] == f"Base.1.15.{message_id}"
    return err


async def test_inventory_through_sushy(lab_bmcs, bmc_admin, redfish):
    name = lab_bmcs.names[0]
    spec = (await bmc_admin.server(name))["spec"]
    root = redfish(name)
    system = root.get_system()  # the only member of the Systems collection
    assert system.path == SYSTEM
    assert (system.uuid, system.serial_number, system.bios_version) == (spec["uuid"], spec["serial"], "1.8.2")
    assert system.power_state == sushy.POWER_STATE_OFF
    assert system.status.health_rollup == sushy.HEALTH_OK
    resets = system.get_allowed_reset_system_values()
    assert {
        sushy.RESET_ON,
        sushy.RESET_FORCE_OFF,
        sushy.RESET_GRACEFUL_SHUTDOWN,
        sushy.RESET_FORCE_RESTART,
        sushy.RESET_GRACEFUL_RESTART,
        sushy.RESET_TYPE_POWER_CYCLE,
        sushy.RESET_PUSH_POWER_BUTTON,
    } <= resets
    targets = system.get_allowed_system_boot_source_values()
    assert {sushy.BOOT_SOURCE_TARGET_PXE, sushy.BOOT_SOURCE_TARGET_HDD} <= targets

    procs = system.processors.get_members()
    gpus = sorted((p for p in procs if p.processor_type == sushy.PROCESSOR_TYPE_GPU), key=lambda p: p.json["Socket"])
    cpus = [p for p in procs if p.processor_type == sushy.PROCESSOR_TYPE_CPU]
    assert len(gpus) == 8 and len(cpus) == 2
    assert {g.model for g in gpus} == {"NVIDIA H200"} and {g.manufacturer for g in gpus} == {"NVIDIA"}
    assert [g.json["SerialNumber"] for g in gpus] == spec["gpu_serials"]
    assert [g.json["UUID"] for g in gpus] == spec["gpu_uuids"] and len(set(spec["gpu_uuids"])) == 8

    assert system.bios.attributes == DEFAULT_BIOS
    inventory = root.get_update_service().firmware_inventory.get_members()
    assert {f.identity: f.version for f in inventory} == DEFAULT_FIRMWARE
    assert all(f.updateable for f in inventory)

    await bmc_admin.set_firmware(name, {"GPU3": "96.00.99.00.01"})  # drift, as after a bad field update
    fw = {f.identity: f.version for f in redfish(name).get_update_service().firmware_inventory.get_members()}
    assert fw["GPU3"] == "96.00.99.00.01" and fw["GPU2"] == DEFAULT_FIRMWARE["GPU2"]


async def test_power_on_restart_off_with_read_back(lab_bmcs, bmc_admin, redfish):
    name = lab_bmcs.names[1]
    root = redfish(name)
    root.get_system(SYSTEM).reset_system(sushy.RESET_ON)
    assert power(root) in (sushy.POWER_STATE_POWERING_ON, sushy.POWER_STATE_ON)
    await until(lambda: power(root) == sushy.POWER_STATE_ON, what="On")
    view = await bmc_admin.server(name)
    assert (view["power"], view["boot_count"], view["booted_from"]) == ("On", 1, "Hdd")

    root.get_system(SYSTEM).reset_system(sushy.RESET_FORCE_RESTART)  # Off, then On again: a second boot
    view = await bmc_admin.server(name)
    assert view["power_state"] != "On" or view["boot_count"] == 2  # never "On" from before the restart
    view = await bmc_admin.wait_power(name, "On", min_boots=2)
    assert power(root) == sushy.POWER_STATE_ON

    root.get_system(SYSTEM).reset_system(sushy.RESET_FORCE_OFF)
    await until(lambda: power(root) == sushy.POWER_STATE_OFF, what="Off")
    root.get_system(SYSTEM).reset_system(sushy.RESET_FORCE_OFF)  # already off: accepted, nothing happens
    view = await bmc_admin.server(name)
    assert (view["power"], view["boot_count"], view["resets"]) == ("Off", 2, 4)

    resets = [e["reset_type"] for e in await bmc_admin.server_audit(name, writes=True) if "reset_type" in e]
    assert resets == ["On", "ForceRestart", "ForceOff", "ForceOff"]


async def test_one_time_pxe_boot_is_consumed_at_power_on(lab_bmcs, bmc_admin, redfish):
    name = lab_bmcs.names[2]
    root = redfish(name)
    root.get_system(SYSTEM).set_system_boot_options(
        sushy.BOOT_SOURCE_TARGET_PXE, enabled=sushy.BOOT_SOURCE_ENABLED_ONCE, mode=sushy.BOOT_SOURCE_MODE_UEFI
    )
    boot = root.get_system(SYSTEM).boot
    assert (boot.target, boot.enabled, boot.mode) == (
        sushy.BOOT_SOURCE_TARGET_PXE,
        sushy.BOOT_SOURCE_ENABLED_ONCE,
        sushy.BOOT_SOURCE_MODE_UEFI,
    )

    root.get_system(SYSTEM).reset_system(sushy.RESET_ON)
    view = await bmc_admin.wait_power(name, "On", min_boots=1)
    assert view["booted_from"] == "Pxe"
    boot = root.get_system(SYSTEM).boot
    assert (boot.target, boot.enabled) == (sushy.BOOT_SOURCE_TARGET_NONE, sushy.BOOT_SOURCE_ENABLED_DISABLED)

    root.get_system(SYSTEM).reset_system(sushy.RESET_GRACEFUL_RESTART)  # the override is spent: disk
    view = await bmc_admin.wait_power(name, "On", min_boots=2)
    assert view["booted_from"] == "Hdd"

    root.get_system(SYSTEM).set_system_boot_options(
        sushy.BOOT_SOURCE_TARGET_PXE, enabled=sushy.BOOT_SOURCE_ENABLED_CONTINUOUS
    )
    root.get_system(SYSTEM).reset_system(sushy.RESET_TYPE_POWER_CYCLE)
    view = await bmc_admin.wait_power(name, "On", min_boots=3)
    assert view["booted_from"] == "Pxe" and view["boot_override"]["enabled"] == "Continuous"


async def test_sel_entries_injected_critical_and_clear_log(lab_bmcs, bmc_admin, redfish):
    name = lab_bmcs.names[0]
    url = lab_bmcs.bmc_urls[name]
    root = redfish(name)
    entries, service = sel(url, root.get_system())
    assert entries == [] and "#LogService.ClearLog" in service["Actions"]

    await bmc_admin.add_sel(name, "Warning", "Inlet temperature high", "OpenBMC.0.4.SensorThresholdWarningHigh")
    await bmc_admin.add_sel(
        name, "Critical", "GPU SXM4 Xid 79: fallen off the bus", "NVIDIA.1.0.GpuXid", at="next_boot", delay=0.2
    )  # a fault that shows during burn-in
    entries, _ = sel(url, root.get_system())
    assert [(e["Severity"], e["EntryType"]) for e in entries] == [("Warning", "SEL")]
    assert root.get_system().status.health_rollup == sushy.HEALTH_WARNING

    root.get_system().reset_system(sushy.RESET_ON)
    entries = await until(
        lambda: [e for e in sel(url, root.get_system())[0] if e["Severity"] == "Critical"], what="critical SEL entry"
    )
    assert entries[0]["MessageId"] == "NVIDIA.1.0.GpuXid" and "Xid 79" in entries[0]["Message"]
    assert entries[0]["Created"] and entries[0]["Id"]
    assert root.get_system().status.health_rollup == sushy.HEALTH_CRITICAL

    clear = service["Actions"]["#LogService.ClearLog"]["target"]
    assert httpx.post(url + clear, auth=AUTH, json={}).status_code == 204
    assert sel(url, root.get_system())[0] == []
    assert root.get_system().status.health_rollup == sushy.HEALTH_OK


async def test_session_limit_then_recovery_after_logout(lab_bmcs, bmc_admin, redfish):
    name = lab_bmcs.names[3]
    url = lab_bmcs.bmc_urls[name]
    roots = [redfish(name, auth="session") for _ in range(4)]
    assert (await bmc_admin.server(name))["sessions"] == 4
    assert all(r.get_system(SYSTEM).power_state == sushy.POWER_STATE_OFF for r in roots)  # X-Auth-Token works

    with pytest.raises(sushy_exc.ServerSideError) as exc:
        redfish(name, auth="session")
    assert exc.value.status_code == 503
    assert exc.value.extended_info[0]["MessageId"] == "Base.1.15.SessionLimitExceeded"
    refused = httpx.post(
        f"{url}/redfish/v1/SessionService/Sessions", json={"UserName": BMC_USER, "Password": BMC_PASSWORD}
    )
    rf_error(refused, 503, "SessionLimitExceeded")
    assert refused.headers["Retry-After"] == "2"
    fallback = redfish(name, auth="either")  # sushy's default auth falls back to Basic
    assert fallback.get_system(SYSTEM).power_state == sushy.POWER_STATE_OFF

    roots[0]._auth.close()  # log out (DELETE the session)
    assert (await bmc_admin.server(name))["sessions"] == 3
    again = redfish(name, auth="session")
    assert again.get_system(SYSTEM).identity == "1"

    await bmc_admin.config(session_timeout=0.3)  # idle sessions expire; sushy logs in again on the 401
    await asyncio.sleep(0.4)
    assert again.get_system(SYSTEM).identity == "1"


async def test_bad_password_is_an_access_error(lab_bmcs, bmc_admin, redfish):
    name = lab_bmcs.names[0]
    url = lab_bmcs.bmc_urls[name]
    with pytest.raises(sushy_exc.AccessError) as exc:
        redfish(name, password="wrong").get_system(SYSTEM)
    assert exc.value.status_code == 401
    with pytest.raises(sushy_exc.AccessError):
        redfish(name, auth="either", password="wrong").get_system(SYSTEM)
    with pytest.raises(sushy_exc.AccessError):
        redfish(name, auth="session", password="wrong")
    assert httpx.get(f"{url}/redfish/v1/").status_code == 200  # the service root is anonymous
    resp = httpx.get(f"{url}{SYSTEM}")
    rf_error(resp, 401, "NoValidSession")
    assert resp.headers["WWW-Authenticate"].startswith("Basic")
    assert (await bmc_admin.server(name))["sessions"] == 0


async def test_outage_answers_503_then_recovers(lab_bmcs, bmc_admin, redfish):
    name = lab_bmcs.names[1]
    url = lab_bmcs.bmc_urls[name]
    root = redfish(name, server_side_retries=40, server_side_retries_delay=0.2)
    cursor = await bmc_admin.audit_cursor()
    # long enough to outlast the checks below on a loaded machine: sushy must still meet it (1 s did not, once)
    await bmc_admin.outage(name, 3.0)
    resp = httpx.get(f"{url}{SYSTEM}", auth=AUTH)
    rf_error(resp, 503, "ServiceTemporarilyUnavailable")
    assert int(resp.headers["Retry-After"]) >= 1
    assert httpx.get(lab_bmcs.bmc_urls[lab_bmcs.names[0]] + SYSTEM, auth=AUTH).status_code == 200  # others fine
    started = time.monotonic()
    assert root.get_system(SYSTEM).power_state == sushy.POWER_STATE_OFF  # sushy retried through the outage
    assert time.monotonic() - started > 0.3
    statuses = [e["status"] for e in await bmc_admin.server_audit(name, since=cursor)]
    assert statuses[:2] == [503, 503] and statuses[-1] == 200

    await bmc_admin.outage(name, 0.5, mode="drop")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}{SYSTEM}", auth=AUTH)
    await asyncio.sleep(0.6)
    assert httpx.get(f"{url}{SYSTEM}", auth=AUTH).status_code == 200

    with httpx.Client(auth=AUTH) as kept:  # a connection opened before the port closes goes with it
        assert kept.get(f"{url}{SYSTEM}").status_code == 200
        await bmc_admin.outage(name, 60, mode="closed")
        with pytest.raises(httpx.TransportError):
            kept.get(f"{url}{SYSTEM}")
    with pytest.raises(httpx.ConnectError):  # refused: nothing listens
        httpx.get(f"{url}{SYSTEM}", auth=AUTH)
    await bmc_admin.reset()  # reopens it
    assert httpx.get(f"{url}{SYSTEM}", auth=AUTH).status_code == 200


async def test_requests_past_the_limit_are_refused_with_retry_after(lab_bmcs, bmc_admin):
    name = lab_bmcs.names[2]
    url = lab_bmcs.bmc_urls[name]
    await bmc_admin.config(max_sessions=2, request_delay=0.5)  # two requests served at once, each for 0.5 s
    async with httpx.AsyncClient(base_url=url, auth=AUTH) as c:
        answers = await asyncio.gather(*(c.get(SYSTEM) for _ in range(3)))
        assert sorted(r.status_code for r in answers) == [200, 200, 503]
        busy = next(r for r in answers if r.status_code == 503)
        rf_error(busy, 503, "ServiceTemporarilyUnavailable")
        assert busy.headers["Retry-After"] == "2"
        assert (await c.get(SYSTEM)).status_code == 200  # the slots are free again once answered


async def test_collections_expand_one_level_as_the_root_advertises(lab_bmcs, bmc_admin):
    url = lab_bmcs.bmc_urls[lab_bmcs.names[0]]
    with httpx.Client(base_url=url, auth=AUTH) as c:
        assert c.get("/redfish/v1/").json()["ProtocolFeaturesSupported"]["ExpandQuery"]["NoLinks"] is True
        inventory = "/redfish/v1/UpdateService/FirmwareInventory"
        expanded = c.get(inventory, params={"$expand": ".($levels=1)"}).json()["Members"]
        assert {m["Id"]: m["Version"] for m in expanded} == DEFAULT_FIRMWARE
        assert all(set(m) == {"@odata.id"} for m in c.get(inventory).json()["Members"])  # links without it
        gpus = c.get(f"{SYSTEM}/Processors", params={"$expand": "."}).json()["Members"]
        assert sum(p["ProcessorType"] == "GPU" for p in gpus) == 8
        rf_error(c.get(inventory, params={"$expand": "*"}), 501, "QueryNotSupported")


async def test_unsupported_dollar_query_parameters_answer_501(lab_bmcs, bmc_admin):
    """DSP0266: a ``$`` query parameter the service does not support answers 501; others are ignored."""
    url = lab_bmcs.bmc_urls[lab_bmcs.names[0]]
    entries = f"{SYSTEM}/LogServices/SEL/Entries"
    with httpx.Client(base_url=url, auth=AUTH) as c:
        rf_error(c.get("/redfish/v1/?$unknown"), 501, "QueryParameterUnsupported")
        rf_error(c.get(SYSTEM, params={"$select": "PowerState"}), 501, "QueryParameterUnsupported")
        rf_error(c.get(f"{SYSTEM}/Processors", params={"$top": "1"}), 501, "QueryParameterUnsupported")
        rf_error(c.get(entries, params={"$top": "x"}), 400, "QueryParameterValueFormatError")
        assert c.get("/redfish/v1/", params={"unknown": "1"}).status_code == 200
        assert c.get(entries, params={"$skip": "0", "$top": "1"}).status_code == 200
        assert c.get(f"{SYSTEM}/Processors", params={"$expand": "."}).status_code == 200


async def test_audit_counts_requests_and_resets_per_server(lab_bmcs, bmc_admin, redfish):
    a, b = lab_bmcs.names[0], lab_bmcs.names[1]
    cursor = await bmc_admin.audit_cursor()
    root = redfish(a)
    for _ in range(3):
        root.get_system(SYSTEM)
    root.get_system(SYSTEM).reset_system(sushy.RESET_ON)
    entries = await bmc_admin.server_audit(a, since=cursor)
    assert {e["server"] for e in entries} == {a}
    assert sum(e["method"] == "GET" and e["path"] == SYSTEM for e in entries) == 4
    assert [e for e in entries if e.get("reset_type")] == [
        {
            **entries[-1],
            "method": "POST",
            "path": f"{SYSTEM}/Actions/ComputerSystem.Reset",
            "status": 204,
            "write": True,
            "auth": "basic",
            "reset_type": "On",
        }
    ]
    assert await bmc_admin.server_audit(b, since=cursor) == []
    counts = await bmc_admin.servers(fields=["requests", "resets"])
    assert counts[a] == {"requests": len(entries), "resets": 1} and counts[b] == {"requests": 0, "resets": 0}

    # an injected failure on one reset: sushy raises, the next attempt goes through
    await bmc_admin.add_fault({"server": a, "method": "POST", "path": "ComputerSystem.Reset$"}, {"status": 500})
    with pytest.raises(sushy_exc.ServerSideError):
        root.get_system(SYSTEM).reset_system(sushy.RESET_FORCE_OFF)
    root.get_system(SYSTEM).reset_system(sushy.RESET_FORCE_OFF)
    statuses = [e["status"] for e in await bmc_admin.server_audit(a, since=cursor, writes=True)]
    assert statuses == [204, 500, 204]


async def test_error_answers_are_redfish_errors(lab_bmcs, bmc_admin):
    url = lab_bmcs.bmc_urls[lab_bmcs.names[0]]
    with httpx.Client(base_url=url, auth=AUTH) as c:
        rf_error(c.get("/redfish/v1/Systems/2"), 404, "ResourceMissingAtURI")
        rf_error(c.patch(SYSTEM, json={"Boot": {"BootSourceOverrideTarget": "Floppy"}}), 400, "PropertyValueNotInList")
        rf_error(c.patch(SYSTEM, json={"PowerState": "On"}), 400, "PropertyNotWritable")
        rf_error(
            c.post(f"{SYSTEM}/Actions/ComputerSystem.Reset", json={"ResetType": "Explode"}),
            400,
            "ActionParameterValueNotInList",
        )
        rf_error(c.post(f"{SYSTEM}/Actions/ComputerSystem.Reset", json={}), 400, "ActionParameterMissing")
        rf_error(
            c.post(
                f"{SYSTEM}/Actions/ComputerSystem.Reset", content=b"{nope", headers={"Content-Type": "application/json"}
            ),
            400,
            "MalformedJSON",
        )
        rf_error(c.delete(SYSTEM), 405, "OperationNotAllowed")
        # BIOS settings are pending until the next boot
        assert c.patch(f"{SYSTEM}/Bios/Settings", json={"Attributes": {"SRIOVSupport": "Disabled"}}).status_code == 204
        assert c.get(f"{SYSTEM}/Bios").json()["Attributes"]["SRIOVSupport"] == "Enabled"
        await bmc_admin.power(lab_bmcs.names[0], "On")
        assert c.get(f"{SYSTEM}/Bios").json()["Attributes"]["SRIOVSupport"] == "Disabled"


async def test_admin_api(lab_bmcs, bmc_admin):
    name = lab_bmcs.names[2]
    faults = {"pending_remaps": [3], "xid_under_load": {"gpu": 5, "xid": 79}}
    assert await bmc_admin.set_gpu_faults(name, faults) == faults
    view = await bmc_admin.power(name, "On")  # lab side: immediate, and a boot
    assert (view["power"], view["power_state"], view["boot_count"], view["booted_from"]) == ("On", "On", 1, "Hdd")
    assert view["gpu_faults"] == faults and view["url"] == lab_bmcs.bmc_urls[name] and view["down_until"] is None
    assert set(view) >= {"boot_override", "sel", "sessions", "requests", "resets", "spec", "firmware", "bios"}
    assert (await bmc_admin.power(name, "Off"))["power"] == "Off"

    config = await bmc_admin.config(power_delay=0.05)
    assert config == {"power_delay": 0.05, "request_delay": 0.0, "max_sessions": 4, "session_timeout": 1800.0,
                      "update_seconds": 0.5, "bmc_restart_seconds": 1.0, "multipart_push": 1.0, "basic_auth": 1.0,
                      "monitor_expires": 0.0}  # fmt: skip
    with pytest.raises(httpx.HTTPStatusError):
        await bmc_admin.config(nonsense=1)
    with pytest.raises(httpx.HTTPStatusError) as exc:
        await bmc_admin.server("no-such-server")
    assert exc.value.response.status_code == 404
    brief = await bmc_admin.servers(fields=["power", "booted_from"])
    assert set(brief) == set(lab_bmcs.names) and brief[name] == {"power": "Off", "booted_from": "Hdd"}

    await bmc_admin.reset()
    view = await bmc_admin.server(name)
    assert (view["gpu_faults"], view["boot_count"], view["booted_from"]) == ({}, 0, None)
    assert (await bmc_admin.config())["power_delay"] == 0.2


def test_spec_defaults():
    s = normalize_spec({"name": "n1", "gpus": 4, "gpu_model": "NVIDIA H100 80GB HBM3", "firmware": {"BMC": "25.01"}})
    assert s["firmware"]["BMC"] == "25.01" and s["firmware"]["BIOS"] == DEFAULT_FIRMWARE["BIOS"]
    assert [k for k in s["firmware"] if k.startswith("GPU")] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert len(s["gpu_serials"]) == len(s["gpu_uuids"]) == 4 and s["power"] == "Off"
    assert normalize_spec("n1")["uuid"] == s["uuid"]  # identifiers follow the name
    assert normalize_spec(s) == s

    from lab.fleet import Fleet, NodeGenerator

    fleet = Fleet(nodes=[NodeGenerator(prefix="node-", count=2)])
    assert [x["name"] for x in fleet_servers(fleet)] == [n.name for n in fleet.node_specs()]


def test_a_thousand_servers_in_one_process():
    servers = [{"name": "big-0000", "gpus": 4, "power": "On"}] + [f"big-{i:04d}" for i in range(1, 1000)]
    started = time.monotonic()
    with LabBmcs(servers=servers, password=BMC_PASSWORD) as bmcs:
        took = time.monotonic() - started
        assert len(set(bmcs.bmc_urls.values())) == 1000
        for name in ("big-0000", "big-0999"):
            system = httpx.get(bmcs.bmc_urls[name] + SYSTEM, auth=AUTH).json()
            assert system["HostName"] == name
        assert httpx.get(bmcs.bmc_urls["big-0000"] + SYSTEM, auth=AUTH).json()["PowerState"] == "On"
        procs = httpx.get(bmcs.bmc_urls["big-0000"] + SYSTEM + "/Processors", auth=AUTH).json()
        assert procs["Members@odata.count"] == 6
    assert took < 15, f"1,000 BMCs took {took:.1f}s to start"
