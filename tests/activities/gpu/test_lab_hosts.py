"""LabHosts over the lab BMC emulator (lab/redfish.py): a host agent comes up when a server powers on, serves
the simulated GPUs (faults from the BMC admin API) through Temporal, goes away at power-off and comes back (with
what a reboot clears, cleared) at the next boot."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import pytest_asyncio

from activities.gpu.models import GpuCheckResult, HostInfo, StressResult, host_task_queue
from lab.hosts import LabHosts
from tests.activities.gpu.conftest import call_host

PREFIX = f"ha{uuid.uuid4().hex[:4]}-"
CHECK = {"expected_count": 8, "expected_model": "H200"}


@pytest.fixture(scope="module")
def bmcs():
    from lab.redfish import LabBmcs

    with LabBmcs(count=2, prefix=PREFIX, power_delay=0.05) as bmcs:
        yield bmcs


@pytest_asyncio.fixture(loop_scope="session")
async def admin(bmcs):
    from lab.redfish import BmcAdmin

    async with BmcAdmin(bmcs.url) as admin:
        await admin.reset()
        yield admin


async def check(client, call_queue, name: str) -> GpuCheckResult:
    return GpuCheckResult.model_validate(await call_host(client, call_queue, "host_gpu_check", host_task_queue(name),
                                                         CHECK))  # fmt: skip


async def test_agent_follows_power_and_serves_faults(client, call_queue, admin, bmcs):
    a, _b = bmcs.names
    async with LabHosts(client, bmcs.url, boot_delay=0.3, poll_interval=0.1) as hosts:
        await hosts.poll_once()
        assert hosts.running() == []

        await admin.set_gpu_faults(a, {"pending_remaps": [1]})
        await admin.power(a, "On")
        await hosts.wait_running(a)
        assert hosts.running() == [a]  # b stays off: no agent
        first = await check(client, call_queue, a)
        assert not first.passed and [(f.gpu, f.check) for f in first.findings] == [(1, "remap_pending")]
        assert first.snapshot.gpus[0].uuid.startswith("GPU-")
        info = HostInfo.model_validate(await call_host(client, call_queue, "host_info", host_task_queue(a)))
        assert info.facts["boot_count"] == "1" and info.facts["booted_from"] == "Hdd"

        await call_host(client, call_queue, "host_reset_gpu", host_task_queue(a), {"index": 1})
        assert hosts.probe(a).resets == [1] and (await check(client, call_queue, a)).passed

        # a fault set while the host runs applies at once; Xid 79 under load loses the GPU until a reboot
        await admin.set_gpu_faults(a, {"xid_under_load": {"gpu": 6, "xid": 79}})
        await hosts.poll_once()
        raw = await call_host(client, call_queue, "host_gpu_stress", host_task_queue(a), {"seconds": 1.0},
                              heartbeat_seconds=5)  # fmt: skip
        stress = StressResult.model_validate(raw)
        assert [(x.gpu, x.xid) for x in stress.xids] == [(6, 79)] and stress.gpus[6].lost
        assert [(f.gpu, f.check) for f in (await check(client, call_queue, a)).findings] == [(6, "gpu_lost")]

        await admin.power(a, "Off")
        await hosts.wait_stopped(a)
        assert hosts.running() == []

        await admin.set_gpu_faults(a, {})
        await admin.power(a, "On")
        await hosts.wait_running(a, boot_count=2)
        assert (await check(client, call_queue, a)).passed  # the reboot brought GPU 6 back
        assert hosts.boots_served(a) == [1, 2]

        # a reboot faster than one poll still restarts the agent for the new boot
        await admin.power(a, "Off")
        await admin.power(a, "On")
        await hosts.wait_running(a, boot_count=3)
        assert hosts.boots_served(a) == [1, 2, 3]
    assert hosts.running() == []


async def test_power_off_during_stress_ends_the_agent_and_fails_the_activity(client, call_queue, admin, bmcs):
    from temporalio.client import WorkflowFailureError

    from tests.activities.gpu.helpers import CallHost, CallHostInput

    a = bmcs.names[0]
    async with LabHosts(client, bmcs.url, boot_delay=0.1, poll_interval=0.1) as hosts:
        await admin.power(a, "On")
        await hosts.wait_running(a)
        handle = await client.start_workflow(
            CallHost.run, CallHostInput(activity="host_gpu_stress", task_queue=host_task_queue(a),
                                        arg={"seconds": 60}, heartbeat_seconds=2),
            id=f"stress-{uuid.uuid4().hex[:8]}", task_queue=call_queue)  # fmt: skip
        for _ in range(100):
            if hosts.probe(a) is not None and hosts.probe(a).loads:
                break
            await asyncio.sleep(0.05)
        await admin.power(a, "Off")
        await asyncio.wait_for(hosts.wait_stopped(a), 10)
        assert not hosts.probe(a)._loading  # the load was stopped with the agent
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 30)
