"""FleetBurnIn: bounded concurrency, the aggregate report, and the fail-fast pause for an operator's decision."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError

from lab.bmc import DEFAULT_FIRMWARE
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.burnin.fleet_burnin import FleetBurnIn, FleetBurnInInput, FleetDecision


def fleet_input(bmcs, names: list[str], **kw) -> FleetBurnInInput:
    return FleetBurnInInput.model_validate({
        "name": f"fleet-{uuid.uuid4().hex[:6]}",
        "servers": [{"name": n, "bmc": {"url": bmcs.bmc_urls[n]}, "site": f"site-{i % 2}",
                     "expected": {"gpus": 8, "gpu_model": "H200", "firmware": DEFAULT_FIRMWARE}}
                    for i, n in enumerate(names)],
        "settings": {"stress_seconds": 1, "dcgm_level": None, "record_in_netbox": False, "boot_timeout": "PT30S"},
        **kw,
    })  # fmt: skip


async def wait_for(handle, predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not predicate(report := await handle.query(FleetBurnIn.report)):
        assert time.monotonic() < deadline, f"timed out; report: {report}"
        await asyncio.sleep(0.2)
    return report


async def test_fleet_pauses_when_failures_look_systemic_and_an_operator_aborts(
        client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker):  # fmt: skip
    names = burnin_bmcs.names[:6]
    for name in names[:3]:  # half the fleet fails: a bad image or rack, not bad servers
        await bmc_admin.set_gpu_faults(name, {"xid_under_load": {"gpu": 0, "xid": 79}})
    inp = fleet_input(burnin_bmcs, names, max_concurrent=2, pause_when_failed_share=0.25,
                      min_finished_before_pause=2)  # fmt: skip
    handle = await client.start_workflow(FleetBurnIn.run, inp, id=inp.workflow_id(), task_queue=burnin_worker)
    with pytest.raises(WorkflowUpdateFailedError) as early:
        await handle.execute_update(FleetBurnIn.decide, FleetDecision(action="continue", reason="too early"))
    assert "not paused" in str(early.value.cause)

    report = await wait_for(handle, lambda r: r.paused is not None and not r.running)
    assert report.failed >= 2 and "waiting for an operator" in report.paused
    assert report.pending > 0  # nothing new started while paused
    assert all(f.result == "failed" and "GPU0" in f.reason for f in report.failures), report.failures

    await handle.execute_update(FleetBurnIn.decide, FleetDecision(action="abort", reason="bad burn-in image"))
    result = await handle.result()
    await record_history(handle, "fleet_burn_in_pause_abort")
    assert result.aborted and result.report.skipped == report.pending
    r = result.report
    assert r.passed + r.failed + r.errors + r.skipped == r.total == len(names)
    # The result lists the servers that did not pass, with why; passed ones are counted.
    assert len(result.outcomes) == len(names) - r.passed and all(o.result != "passed" for o in result.outcomes)
    assert result.report.decisions == ["abort: bad burn-in image"]


async def test_fleet_respects_concurrency_per_group_and_continues_after_a_decision(
        client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker):  # fmt: skip
    names = burnin_bmcs.names[:6]
    await bmc_admin.set_gpu_faults(names[0], {"pending_remaps": [1]})
    await bmc_admin.set_gpu_faults(names[1], {"pending_remaps": [1]})
    inp = fleet_input(burnin_bmcs, names, max_concurrent=4, group_by="site", max_concurrent_per_group=1,
                      pause_when_failed_share=0.5, min_finished_before_pause=2)  # fmt: skip
    handle = await client.start_workflow(FleetBurnIn.run, inp, id=inp.workflow_id(), task_queue=burnin_worker)
    seen_running: list[list[str]] = []

    async def watch() -> None:
        while True:
            seen_running.append((await handle.query(FleetBurnIn.report)).running)
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch())
    try:
        report = await wait_for(handle, lambda r: r.paused is not None)  # 2 of the first 2 failed
        await handle.execute_update(FleetBurnIn.decide, FleetDecision(action="continue", reason="known bad pair"))
        result = await handle.result()
    finally:
        watcher.cancel()
    assert report.failed == 2
    assert not result.aborted
    assert (result.report.passed, result.report.failed) == (4, 2)
    # one server per site at a time: never two of the same site running together
    site = {n: f"site-{i % 2}" for i, n in enumerate(names)}
    assert all(len({site[n] for n in running}) == len(running) for running in seen_running)
    assert max(len(r) for r in seen_running) <= 2


async def test_servers_behind_one_bmc_take_turns(client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker):
    """Two servers listed with one BMC URL never have burn-ins talking to it at once; a third runs beside them."""
    shared, own, alias = burnin_bmcs.names[0], burnin_bmcs.names[1], f"alias-{uuid.uuid4().hex[:4]}"
    inp = fleet_input(burnin_bmcs, [shared, own], max_concurrent=3, pause_when_failed_share=1.0)
    behind = inp.servers[0].model_copy(update={"name": alias})  # no host agent of its own: it fails its boot
    inp = inp.model_copy(
        update={
            "servers": [inp.servers[0], behind, inp.servers[1]],
            "settings": inp.settings.model_copy(update={"boot_timeout": timedelta(seconds=3)}),
        }
    )
    handle = await client.start_workflow(FleetBurnIn.run, inp, id=inp.workflow_id(), task_queue=burnin_worker)
    result = await handle.result()
    await record_history(handle, "fleet_burn_in_per_bmc")
    assert (result.report.passed, result.report.failed) == (2, 1), result.outcomes
    spans = {}
    for name in (shared, alias, own):
        d = await client.get_workflow_handle(f"burn-in/{name}").describe()
        spans[name] = (d.start_time, d.close_time)
    first, second = sorted([spans[shared], spans[alias]])
    assert first[1] <= second[0], spans  # one after the other
    assert spans[own][0] < first[1], spans  # the server with a BMC of its own did not wait
