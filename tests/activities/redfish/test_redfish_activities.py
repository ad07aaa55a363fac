"""The Redfish activities (activities/redfish.py) against the lab BMCs and the real sushy-tools emulator."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import redfish_auth
from activities.redfish import BmcRef, BootRequest, PowerRequest, RedfishActivities, SelQuery
from activities.support.secrets import SecretRef
from tests.activities.redfish.conftest import BMC_PASSWORD, ST_PASSWORD, ST_USER


@pytest.fixture
def acts(bmc_secret_file) -> RedfishActivities:
    return RedfishActivities(SecretRef.parse(f"file:{bmc_secret_file}"))


def bmc(lab_bmcs, i: int = 0) -> BmcRef:
    return BmcRef(url=lab_bmcs.bmc_urls[lab_bmcs.names[i]])


async def resets(admin, name: str) -> list[str]:
    return [e["reset_type"] for e in await admin.server_audit(name, writes=True) if e.get("reset_type")]


async def test_power_is_read_first_and_verified(acts, lab_bmcs, bmc_admin):
    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs), lab_bmcs.names[0]
    on = await env.run(acts.redfish_power, PowerRequest(bmc=ref, state="On"))
    assert (on.state, on.changed) == ("On", True)
    assert (await bmc_admin.server(name))["power"] == "On"
    again = await env.run(acts.redfish_power, PowerRequest(bmc=ref, state="On"))
    assert again.changed is False
    off = await env.run(acts.redfish_power, PowerRequest(bmc=ref, state="Off"))
    assert off.changed is True
    assert await resets(bmc_admin, name) == ["On", "ForceOff"]  # the no-op sent nothing


async def test_one_time_network_boot_is_read_back_and_consumed(acts, lab_bmcs, bmc_admin):
    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 1), lab_bmcs.names[1]
    set_ = await env.run(acts.redfish_set_boot, BootRequest(bmc=ref, target="Pxe", enabled="Once", mode="UEFI"))
    assert (set_.target, set_.enabled, set_.changed) == ("Pxe", "Once", True)
    unchanged = await env.run(acts.redfish_set_boot, BootRequest(bmc=ref, target="Pxe", enabled="Once", mode="UEFI"))
    assert unchanged.changed is False
    await env.run(acts.redfish_power, PowerRequest(bmc=ref, state="On"))
    state = await bmc_admin.server(name)
    assert state["booted_from"] == "Pxe"
    assert state["boot_override"]["enabled"] == "Disabled"


async def test_inventory_and_sel(acts, lab_bmcs, bmc_admin):
    from lab.bmc import DEFAULT_FIRMWARE

    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 2), lab_bmcs.names[2]
    inv = await env.run(acts.redfish_inventory, ref)
    assert len(inv.gpus) == 8 and all(g.model.startswith("NVIDIA H200") for g in inv.gpus)
    assert len({g.uuid for g in inv.gpus}) == 8
    assert inv.firmware == DEFAULT_FIRMWARE
    first = await env.run(acts.redfish_sel, SelQuery(bmc=ref))
    await bmc_admin.add_sel(name, severity="Critical", message="GPU 3 Xid 79", message_id="Vendor.1.0.GpuFault")
    later = await env.run(acts.redfish_sel, SelQuery(bmc=ref, after_id=first.last_id))
    assert [(e.severity, e.message) for e in later.entries] == [("Critical", "GPU 3 Xid 79")]
    assert later.critical and later.last_id != first.last_id


async def requests_since(admin, name: str, cursor: int) -> list[str]:
    return [f"{e['method']} {e['path'].removeprefix('/redfish/v1')}" for e in await admin.server_audit(name, cursor)]


async def test_calls_carry_what_they_read_and_ask_nothing_twice(acts, lab_bmcs, bmc_admin):
    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 0), lab_bmcs.names[0]
    cursor = await bmc_admin.audit_cursor()
    inv = await env.run(acts.redfish_inventory, ref)
    assert len(inv.gpus) == 8 and len(inv.firmware) == 15
    assert (inv.system, inv.sel_entries) == ("/redfish/v1/Systems/1", "/redfish/v1/Systems/1/LogServices/SEL/Entries")
    assert await requests_since(bmc_admin, name, cursor) == [  # collections expanded: one request each
        "GET /", "GET /Systems", "GET /Systems/1", "GET /UpdateService",
        "GET /UpdateService/FirmwareInventory", "GET /Systems/1/Processors", "GET /Systems/1/LogServices",
    ]  # fmt: skip
    known = ref.model_copy(update={"system": inv.system})
    cursor = await bmc_admin.audit_cursor()
    log = await env.run(acts.redfish_sel, SelQuery(bmc=known, entries=inv.sel_entries))
    assert log.entries_path == inv.sel_entries
    boot = await env.run(acts.redfish_set_boot, BootRequest(bmc=known, target="Pxe"))
    assert (boot.changed, boot.power_state) == (True, "Off")
    on = await env.run(acts.redfish_power, PowerRequest(bmc=known, state="On", current=boot.power_state))
    assert on.changed and (await bmc_admin.server(name))["booted_from"] == "Pxe"
    assert await requests_since(bmc_admin, name, cursor) == [
        "GET /Systems/1/LogServices/SEL/Entries",
        "GET /Systems/1", "PATCH /Systems/1", "GET /Systems/1",  # read, write, read back
        "POST /Systems/1/Actions/ComputerSystem.Reset", "GET /Systems/1",  # told it was Off: reset, then verify
    ]  # fmt: skip

    # Told a state that is no longer true: the BMC's refusal sends it back to reading first.
    await bmc_admin.add_fault({"server": name, "method": "POST", "path": "ComputerSystem.Reset$"}, {"status": 409})
    again = await env.run(acts.redfish_power, PowerRequest(bmc=known, state="On", current="Off"))
    assert again.changed is False and await resets(bmc_admin, name) == ["On"]
    with pytest.raises(ValueError, match="Redfish path"):
        SelQuery(bmc=known, entries="https://elsewhere/redfish/v1/x")


async def test_inventory_and_sel_in_one_call_ask_what_both_did(acts, lab_bmcs, bmc_admin):
    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 2), lab_bmcs.names[2]
    await bmc_admin.add_sel(name, severity="Critical", message="PSU 2 lost input", message_id="Vendor.1.0.Psu")
    cursor = await bmc_admin.audit_cursor()
    inv = await env.run(acts.redfish_inventory_and_sel, ref)
    assert await requests_since(bmc_admin, name, cursor) == [  # the inventory's seven, then the entries
        "GET /", "GET /Systems", "GET /Systems/1", "GET /UpdateService", "GET /UpdateService/FirmwareInventory",
        "GET /Systems/1/Processors", "GET /Systems/1/LogServices", "GET /Systems/1/LogServices/SEL/Entries",
    ]  # fmt: skip
    assert inv.sel is not None and [e.message for e in inv.sel.critical] == ["PSU 2 lost input"]
    assert inv.model_copy(update={"sel": None}) == await env.run(acts.redfish_inventory, ref)
    assert inv.sel == await env.run(acts.redfish_sel, SelQuery(bmc=ref, entries=inv.sel_entries))


async def test_a_busy_bmc_is_retried_when_it_asks(acts, lab_bmcs, bmc_admin):
    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 1), lab_bmcs.names[1]
    cursor = await bmc_admin.audit_cursor()
    await bmc_admin.outage(name, seconds=3)
    with pytest.raises(ApplicationError) as busy:
        await env.run(acts.redfish_health, ref.model_copy(update={"system": "1"}))
    assert busy.value.type == "BmcUnavailable" and not busy.value.non_retryable
    assert busy.value.next_retry_delay is not None and 2 <= busy.value.next_retry_delay.total_seconds() <= 4
    assert "asked to retry after" in busy.value.message
    assert len(await bmc_admin.server_audit(name, cursor)) == 1  # no retry of its own behind the BMC's back


async def test_errors_are_classified_and_never_carry_the_password(acts, lab_bmcs, bmc_admin, tmp_path):
    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 3), lab_bmcs.names[3]
    wrong = tmp_path / "wrong"
    wrong.write_text("admin:not-the-password")
    with pytest.raises(ApplicationError) as auth:
        await env.run(acts.redfish_health, ref.model_copy(update={"credentials": f"file:{wrong}"}))
    assert auth.value.type == "RedfishAuth" and auth.value.non_retryable
    await bmc_admin.outage(name, seconds=3)
    with pytest.raises(ApplicationError) as down:
        await env.run(acts.redfish_health, ref)
    assert down.value.type == "BmcUnavailable" and not down.value.non_retryable
    with pytest.raises(ApplicationError) as unset:
        await env.run(RedfishActivities(None).redfish_health, ref)
    assert unset.value.type == "RedfishNotConfigured" and unset.value.non_retryable
    for err in (auth.value, down.value, unset.value):
        assert BMC_PASSWORD not in str(err) and "not-the-password" not in str(err)
    with pytest.raises(ValueError, match="secret reference"):
        BmcRef(url="http://127.0.0.1:1", credentials="admin:hunter2")


async def test_a_bmc_that_refuses_basic_auth_is_asked_in_one_session_per_attempt(
    acts, lab_bmcs, bmc_admin, bmc_secret_file, tmp_path
):
    """A BMC with HTTP Basic turned off (401) takes only X-Auth-Token sessions: each attempt logs in once, logs
    out at its end; wrong credentials are still RedfishAuth."""
    from activities.firmware.activities import FirmwareActivities

    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 3), lab_bmcs.names[3]
    await bmc_admin.config(basic_auth=0)
    cursor = await bmc_admin.audit_cursor()
    assert (await env.run(acts.redfish_power, PowerRequest(bmc=ref, state="On"))).state == "On"
    assert len((await env.run(acts.redfish_inventory, ref)).gpus) == 8
    firmware = FirmwareActivities(SecretRef.parse(f"file:{bmc_secret_file}"))
    assert (await env.run(firmware.firmware_inventory, ref)).versions
    log = await bmc_admin.server_audit(name, since=cursor)
    logins = [e for e in log if e["method"] == "POST" and e["path"].endswith("/SessionService/Sessions")]
    logouts = [e for e in log if e["method"] == "DELETE" and "/SessionService/Sessions/" in e["path"]]
    assert len(logins) == len(logouts) == 3 and all(e["status"] == 201 for e in logins), log
    assert all(e["status"] == 401 for e in log if e.get("auth") is None and e["path"] != "/redfish/v1/" and e not in
               logins)  # fmt: skip
    assert (await bmc_admin.server(name))["sessions"] == 0
    wrong = tmp_path / "wrong"
    wrong.write_text("admin:not-the-password")
    with pytest.raises(ApplicationError) as auth:
        await env.run(acts.redfish_health, ref.model_copy(update={"credentials": f"file:{wrong}"}))
    assert auth.value.type == "RedfishAuth" and auth.value.non_retryable
    redfish_auth._SESSION_BMCS.discard(ref.url)  # the worker's memory: later tests count Basic requests


async def test_a_bmc_whose_port_is_closed_is_retryable_and_recovers_when_it_reopens(acts, lab_bmcs, bmc_admin):
    """A BMC's web server gone (connection refused), not a 5xx nor a hang: retryable, and fine once it listens."""
    import httpx

    from tests.activities.redfish.test_lab_bmc import until

    def reachable(url: str) -> bool:
        try:
            return httpx.get(f"{url}/redfish/v1/").status_code == 200
        except httpx.ConnectError:
            return False

    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 2), lab_bmcs.names[2]
    await bmc_admin.outage(name, seconds=1.5, mode="closed")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{ref.url}/redfish/v1/")
    with pytest.raises(ApplicationError) as down:
        await env.run(acts.redfish_health, ref)
    assert down.value.type == "BmcUnavailable" and not down.value.non_retryable
    assert "does not answer" in down.value.message
    await until(lambda: reachable(ref.url), timeout=10, what="the port reopened")
    assert (await env.run(acts.redfish_health, ref)).power_state == "Off"


async def test_power_and_boot_against_sushy_tools(sushy_tools, tmp_path, monkeypatch):
    """The power and boot subset against a third-party Redfish server (its power lands 0-11 s late)."""
    monkeypatch.setenv("MILLWRIGHT_TEST_ST_CREDENTIALS", f"{ST_USER}:{ST_PASSWORD}")
    acts = RedfishActivities(SecretRef.parse("env:MILLWRIGHT_TEST_ST_CREDENTIALS"))
    env = ActivityEnvironment()
    ref = BmcRef(url=sushy_tools.url, system=sushy_tools.system_ids[1])
    boot = await env.run(acts.redfish_set_boot, BootRequest(bmc=ref, target="Pxe", enabled="Once", mode="UEFI"))
    assert boot.target == "Pxe"  # sushy-tools reads Enabled back as Continuous: only the target is verified
    on = await env.run(acts.redfish_power, PowerRequest(bmc=ref, state="On", timeout_seconds=30))
    assert on.state == "On"
    assert (await env.run(acts.redfish_power, PowerRequest(bmc=ref, state="On"))).changed is False
    with pytest.raises(ApplicationError) as many:
        await env.run(acts.redfish_health, BmcRef(url=sushy_tools.url))
    assert many.value.type == "RedfishRejected" and "3 systems" in many.value.message
