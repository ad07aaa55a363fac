"""FabricAudit run by a real Temporal Schedule (as in production): the schedule is created, triggered, its run's
result reports the injected drift exactly, and the schedule is deleted."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import httpx
import pytest
from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)
from temporalio.service import RPCError

from tests.workflows.fabric.conftest import PASSWORD
from workflows.fabric.audit import FabricAudit, FabricAuditInput, FabricAuditResult
from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput

pytestmark = pytest.mark.timeout(180)


async def test_scheduled_audit_reports_injected_drift(client, ufm_worker, ufm, ufm_stub, fleet):
    ports = fleet.ib_ports()
    h = list(ports)
    fabric = f"ib-{uuid.uuid4().hex[:6]}"
    tq = ufm_worker.task_queue
    ra = await client.execute_workflow(
        IsolateTenant.run,
        IsolateTenantInput(fabric=fabric, tenant="sa", hosts=h[0:2], netbox=False),
        id=f"isolate-tenant/{fabric}/sa",
        task_queue=tq,
    )
    await client.execute_workflow(
        IsolateTenant.run,
        IsolateTenantInput(fabric=fabric, tenant="sb", hosts=h[2:4], netbox=False),
        id=f"isolate-tenant/{fabric}/sb",
        task_queue=tq,
    )
    lost, stranger = sorted(ports[h[0]])[0], sorted(ports[h[5]])[0]
    async with httpx.AsyncClient(base_url=ufm_stub.url + "/ufmRest", auth=("admin", PASSWORD)) as c:
        (await c.delete(f"/resources/pkeys/{ra.pkey}/guids/{lost}")).raise_for_status()
        (await c.post("/resources/pkeys", json={"pkey": ra.pkey, "guids": [stranger]})).raise_for_status()
    before = await ufm.state()

    audit_input = FabricAuditInput(fabric=fabric)  # repair off
    schedule_id = f"fabric-audit/{fabric}"
    handle = await client.create_schedule(
        schedule_id,
        Schedule(
            action=ScheduleActionStartWorkflow(
                FabricAudit.run,
                audit_input,
                id=audit_input.workflow_id(),
                task_queue=tq,
                execution_timeout=timedelta(minutes=10),
            ),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(hours=1))]),
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
        ),
    )
    try:
        await handle.trigger(overlap=ScheduleOverlapPolicy.SKIP)
        for _ in range(200):
            desc = await handle.describe()
            if desc.info.recent_actions:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the schedule never started its run")
        started = desc.info.recent_actions[0].action
        assert started.workflow_id.startswith(audit_input.workflow_id())  # the server adds the start time
        run = client.get_workflow_handle_for(
            FabricAudit.run, started.workflow_id, run_id=started.first_execution_run_id
        )
        result: FabricAuditResult = await asyncio.wait_for(run.result(), timeout=60)
    finally:
        await handle.delete()

    assert {(d.kind, d.pkey, d.guid, d.host) for d in result.drift} == {
        ("missing-member", ra.pkey, lost, h[0]),
        ("unknown-member", ra.pkey, stranger, h[5]),
    }, result.drift
    assert not result.clean and not result.repaired
    assert all(ra.pkey in d.line() and d.guid in d.line() for d in result.drift)  # exactly what and where
    assert await ufm.state() == before  # repair off: nothing written
    with pytest.raises(RPCError):  # deleted
        await handle.describe()
