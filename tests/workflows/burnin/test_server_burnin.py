"""ServerBurnIn through Redfish on a real dev server: the lab's BMCs, the real host agent over simulated GPUs."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ActivityError, ApplicationError, RetryState

from lab.bmc import DEFAULT_FIRMWARE
from tests.activities.redfish import conftest as _redfish
from tests.workflows.burnin.conftest import BMC_PASSWORD
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.burnin.server_burnin import ServerBurnIn, ServerBurnInInput, ServerBurnInResult

STRESS = 2
https_bmcs = _redfish.https_bmcs  # a lab BMC answering HTTPS with a certificate of the session's lab CA


def burn_in_input(bmcs, name: str, **settings) -> ServerBurnInInput:
    return ServerBurnInInput.model_validate({
        "server": {"name": name, "bmc": {"url": bmcs.bmc_urls[name]},
                   "expected": {"gpus": 8, "gpu_model": "H200", "firmware": DEFAULT_FIRMWARE}},
        "settings": {"stress_seconds": STRESS, "dcgm_level": None, "record_in_netbox": False,
                     "boot_timeout": "PT30S", **settings},
    })  # fmt: skip


async def start(client, queue: str, inp: ServerBurnInInput) -> WorkflowHandle:
    return await client.start_workflow(ServerBurnIn.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                       task_queue=queue)  # fmt: skip


async def wait_phase(handle: WorkflowHandle, phase: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (p := await handle.query(ServerBurnIn.progress)).phase != phase:
        assert time.monotonic() < deadline, f"never reached {phase}; at {p.phase}"
        await asyncio.sleep(0.1)


async def resets(admin, name: str) -> list[str]:
    return [e["reset_type"] for e in await admin.server_audit(name, writes=True) if e.get("reset_type")]


async def test_healthy_server_passes_and_boots_back_to_disk(client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker):
    name = burnin_bmcs.names[0]
    handle = await start(client, burnin_worker, burn_in_input(burnin_bmcs, name))
    result: ServerBurnInResult = await handle.result()
    assert (result.result, result.findings, result.gpus) == ("passed", [], 8)
    await record_history(handle, "server_burn_in_pass_fewer_calls")
    state = await bmc_admin.server(name)
    # Off already (no reset), On into the image, then Off and On into the disk.
    assert await resets(bmc_admin, name) == ["On", "ForceOff", "On"]
    assert (state["power"], state["booted_from"], state["boot_count"]) == ("On", "Hdd", 2)
    assert lab_hosts.boots_served(name)[:1] == [1]  # the agent ran in the burn-in image's boot
    # Each BMC call asks only what it was not told: the root and the system collection once, the SEL's path and
    # the power state carried (docs/burn-in.md counts them).
    asked = Counter(
        f"{e['method']} {e['path'].removeprefix('/redfish/v1')}" for e in await bmc_admin.server_audit(name)
    )
    assert (asked["GET /"], asked["GET /Systems"], asked["GET /Systems/1/LogServices"]) == (1, 1, 1), asked
    assert asked.total() == 21, asked
    # The SEL read with the inventory, and no power Off asked of a server the boot override's read found Off.
    called = Counter(e.activity_task_scheduled_event_attributes.activity_type.name
                     for e in (await handle.fetch_history()).events if e.HasField("activity_task_scheduled_event_attributes"))  # fmt: skip
    assert (called["redfish_inventory_and_sel"], called["redfish_sel"], called["redfish_power"]) == (1, 1, 3), called


async def test_each_gpu_fault_and_a_firmware_drift_fail_with_evidence(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker
):
    names = burnin_bmcs.names
    faults = {names[1]: {"pending_remaps": [2]}, names[2]: {"xid_under_load": {"gpu": 5, "xid": 79}},
              names[3]: {"pcie_width": {"gpu": 1, "width": 8}}}  # fmt: skip
    for name, spec in faults.items():
        await bmc_admin.set_gpu_faults(name, spec)
    await bmc_admin.set_firmware(names[4], {"BMC": "23.11"})
    handles = [await start(client, burnin_worker, burn_in_input(burnin_bmcs, n)) for n in names[1:5]]
    results = {r.server: r for r in await asyncio.gather(*(h.result() for h in handles))}
    fails = {n: [(f.check, f.subject) for f in r.findings if f.severity == "fail"] for n, r in results.items()}
    assert ("gpu:remap_pending", "GPU2") in fails[names[1]]
    assert ("gpu:xid", "GPU5") in fails[names[2]]
    assert any("79" in f.evidence for f in results[names[2]].findings)
    assert ("gpu:pcie_link", "GPU1") in fails[names[3]]
    assert fails[names[4]] == [("firmware", "BMC")]
    assert "23.11" in results[names[4]].findings[0].evidence
    for name in names[1:5]:
        assert results[name].result == "failed"
        assert (await bmc_admin.server(name))["power"] == "Off"  # failed servers are left powered off


async def test_critical_sel_entry_during_stress_fails_the_server(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker
):
    name = burnin_bmcs.names[5]
    await bmc_admin.add_sel(name, severity="Critical", message="old PSU event", message_id="Vendor.1.0.Psu")
    handle = await start(client, burnin_worker, burn_in_input(burnin_bmcs, name, stress_seconds=4))
    await wait_phase(handle, "stressing")
    await bmc_admin.add_sel(name, severity="Critical", message="CPU 1 IERR", message_id="Vendor.1.0.CpuIerr")
    result = await handle.result()
    await record_history(handle, "server_burn_in_sel_fail")
    assert result.result == "failed"
    assert [(f.check, f.evidence) for f in result.findings] == [
        ("sel", "Critical: CPU 1 IERR (Vendor.1.0.CpuIerr)")
    ]  # the entry from before is a note, not a failure
    assert any("old PSU event" in n for n in result.notes)


async def test_bmc_outage_in_the_middle_is_survived(client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker):
    name = burnin_bmcs.names[6]
    handle = await start(client, burnin_worker, burn_in_input(burnin_bmcs, name, stress_seconds=3))
    await wait_phase(handle, "stressing")
    await bmc_admin.outage(name, seconds=6)  # outlasts the stress window: the SEL read after it meets the outage
    result = await handle.result()
    assert result.result == "passed", result.summary()
    statuses = [e["status"] for e in await bmc_admin.server_audit(name)]
    assert 503 in statuses  # the outage was met, and retried through
    assert (await bmc_admin.server(name))["booted_from"] == "Hdd"


async def test_a_bmc_behind_an_untrusted_certificate_ends_the_burn_in_at_once(client, https_bmcs, burnin_worker,
                                                                              monkeypatch):  # fmt: skip
    monkeypatch.setenv("MW_TEST_HTTPS_BMC", f"{_redfish.BMC_USER}:{_redfish.BMC_PASSWORD}")
    name = https_bmcs.names[0]
    inp = ServerBurnInInput.model_validate({
        "server": {"name": name, "bmc": {"url": https_bmcs.bmc_urls[name], "credentials": "env:MW_TEST_HTTPS_BMC"},
                   "expected": {"gpus": 8}},
        "settings": {"record_in_netbox": False},
    })  # fmt: skip
    handle = await start(client, burnin_worker, inp)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    activity_error = failed.value.cause
    assert isinstance(activity_error, ActivityError) and activity_error.retry_state == RetryState.NON_RETRYABLE_FAILURE
    assert isinstance(activity_error.cause, ApplicationError) and activity_error.cause.type == "TlsVerificationFailed"
    assert "MILLWRIGHT_BMC_CA_BUNDLE" in str(activity_error.cause)
    attempts = [e.activity_task_started_event_attributes.attempt for e in (await handle.fetch_history()).events
                if e.HasField("activity_task_started_event_attributes")]  # fmt: skip
    assert attempts == [1]  # the inventory read was tried once, not retried for an hour


async def test_bmc_password_is_in_no_history(client):
    """Every burn-in run of this session: the password never entered an input, result, heartbeat or error."""
    found = 0
    async for execution in client.list_workflows("WorkflowType = 'ServerBurnIn' OR WorkflowType = 'FleetBurnIn'"):
        history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        assert BMC_PASSWORD not in history.to_json()
        found += 1
    assert found >= 5


async def test_a_bmc_past_its_limit_is_waited_out_as_it_asks_and_shown(
        client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker):  # fmt: skip
    name = burnin_bmcs.names[2]
    await bmc_admin.config(max_sessions=0)  # every request is past the limit: 503 with Retry-After: 2
    cursor = await bmc_admin.audit_cursor()
    handle = await start(client, burnin_worker, burn_in_input(burnin_bmcs, name))
    deadline = time.monotonic() + 60
    while not (waiting := (await handle.query(ServerBurnIn.progress)).waiting):
        assert time.monotonic() < deadline, "the busy BMC never showed in progress"
        await asyncio.sleep(0.2)
    assert waiting[0].endpoint.startswith("BMC ") and "asked to retry after 2s" in waiting[0].error, waiting
    refused = [e["time"] for e in await bmc_admin.server_audit(name, since=cursor) if e["status"] == 503]
    assert len(refused) >= 3 and all(b - a >= 1.9 for a, b in itertools.pairwise(refused)), refused  # as it asked
    await bmc_admin.config(max_sessions=4)
    result: ServerBurnInResult = await handle.result()
    assert result.result == "passed" and (await handle.query(ServerBurnIn.progress)).waiting == []
    # While the call failed, one timer stood for its retry_timeout, cancelled once it answered (endpoints.py).
    events = (await handle.fetch_history()).events
    deadline = [
        e.timer_started_event_attributes.timer_id
        for e in events
        if e.HasField("timer_started_event_attributes") and b"given up on" in e.user_metadata.summary.data
    ]
    assert len(deadline) == 1, deadline
    assert [e for e in events if e.HasField("timer_canceled_event_attributes")
            and e.timer_canceled_event_attributes.timer_id == deadline[0]], "the timer outlived the call"  # fmt: skip
    await record_history(handle, "server_burn_in_bmc_waited_out_by_timer")
