"""A domain-wide NVLink fault on 1 of 4 GB200 NVL72 racks (lab/rack_fabric.py: the clique label gone from its 18
nodes, each GpuHealthy=False until every tray of the rack has been power-cycled), remediated whole by RackRemediation
through each tray's BMC (lab/bmc_trays.py: `Chassis/CBC_0`'s ComputeTrayIndex, and 9 NVLink switch trays), under the
cluster's disruption budget. Judged from the emulator's audit, the BMCs' audit and the fabric's history."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio

from activities.redfish import BmcRef
from lab.nvl72 import Nvl72Fleet
from lab.redfish import BmcAdmin
from starter.controls import budget_set
from tests.kube_helpers import wait_for
from tests.workflows.burnin.conftest import BMC_PASSWORD, BMC_USER
from workflows.remediation.rack_models import RackRemediationResult

pytestmark = pytest.mark.timeout(180)

FLEET = Nvl72Fleet(cluster="lab", racks=4, seed=3)
RACK = "rack-002"


@pytest.fixture(scope="module")
def tray_bmcs():
    from lab.redfish import LabBmcs

    with LabBmcs(servers=FLEET.bmc_specs(), prefix=f"t-{uuid.uuid4().hex[:4]}-", user=BMC_USER,
                 password=BMC_PASSWORD, power_delay=0.05) as bmcs:  # fmt: skip
        yield bmcs


@pytest_asyncio.fixture(loop_scope="session")
async def fabric(tray_bmcs, k8s, core):
    """The fleet seeded (its gangs running), the fabric following every tray's power."""
    from lab.nvl72 import nvl72_objects
    from lab.rack_fabric import RackFabric
    from lab.redfish import BmcAdmin

    await k8s.seed(nvl72_objects(racks=FLEET.racks, seed=FLEET.seed, cluster=FLEET.cluster).objects)
    await k8s.configure(jobs={"defaultSeconds": 0.3, "rules": []})
    async with BmcAdmin(tray_bmcs.url) as admin:
        await admin.reset()
        fabric = RackFabric(core, admin, FLEET)
        await fabric.start()
        async with fabric.power_link(poll_interval=0.05):
            yield fabric


def bmc(tray_bmcs, tray: str) -> BmcRef:
    return BmcRef(url=tray_bmcs.bmc_urls[tray])


def rack_settings(tray_bmcs, rack: str) -> dict:
    """What a rack run of `rack` needs to know: its trays' BMCs; settings that keep a test short."""
    return {"bmcs": {n: bmc(tray_bmcs, n).model_dump() for n in FLEET.layout()[rack]},
            "switch_bmcs": [bmc(tray_bmcs, t).model_dump() for t in FLEET.switch_tray_names(rack)],
            "drain": {"eviction_retry_interval": 0.5, "timeout": 60}, "ready_timeout": 60, "fabric_timeout": 20,
            "power_timeout": 30, "domain_check": {"image": "registry.local/nccl-tests", "version": "2.21",
                                                  "timeout": 60}}  # fmt: skip


async def writes_to_nodes(k8s, since: int = 0) -> list[dict]:
    return [e for e in await k8s.audit(since=since, writes=True) if e.get("resource") == "nodes"]


async def running(handle):
    from temporalio.service import RPCError

    try:
        return (await handle.describe()).status.name == "RUNNING"
    except RPCError:
        return False


def unschedulable_after(entry: dict) -> bool | None:
    return (entry.get("nodeAfter") or {}).get("unschedulable")


async def test_a_domain_wide_fault_is_remediated_once_and_whole(client, rem_worker, k8s, fabric, tray_bmcs,
                                                                kubeconfig_path, monkeypatch):  # fmt: skip
    """The issue's case, from the event path: one RackRemediation, no NodeRemediation power-cycling a node of the
    domain, the domain out of service at once within the budget, every tray cycled once in order, the domain check
    run, all 18 nodes back together; a second fault on the rack while it runs starts nothing new."""
    from tests.workflows.remediation.test_fault_events import payload, post, running_event_path

    await budget_set(client, "lab", count=18, nvlink_domains=1, by="sre", reason="a rack at a time",
                     task_queue=rem_worker.task_queue)  # fmt: skip
    layout = FLEET.layout()
    nodes = layout[RACK]
    settings = rack_settings(tray_bmcs, RACK)
    escalation = {"rack": {k: v for k, v in settings.items() if k not in ("bmcs", "switch_bmcs")},
                  "switch_trays": {r: [bmc(tray_bmcs, t) for t in FLEET.switch_tray_names(r)] for r in layout}}  # fmt: skip
    every_bmc = {n: bmc(tray_bmcs, n) for ns in layout.values() for n in ns}
    since = await k8s.audit_cursor()
    async with running_event_path(client, rem_worker, kubeconfig_path, monkeypatch, hold=1.0, bmcs=every_bmc,
                                  escalation=escalation) as (events, url):  # fmt: skip
        await fabric.fault(RACK, origin=nodes[11])
        handle = client.get_workflow_handle(f"rack-remediation/lab/{RACK}", result_type=RackRemediationResult)
        await wait_for(lambda: running(handle), what="the rack's remediation")
        # A second fault on the rack while it runs: an XID alert for one of its nodes.
        status, answer = await post(url, payload(nodes[3], alertname="GpuXid149"))
        assert status == 200 and answer["outcomes"][0]["status"] == "escalated", answer
        result = await handle.result()
        outcomes = list(events.recent)

    assert result.outcome == "healthy", result
    assert result.nodes == nodes  # tray order, as each tray's BMC says
    assert sorted(result.returned) == sorted(nodes) and result.power_cycles == 18 + 9
    assert {o.status for o in outcomes} <= {"escalated", "already-running"}, outcomes  # no NodeRemediation
    assert {o.node for o in outcomes} >= set(nodes) and {o.workflow_id for o in outcomes} == {handle.id}
    assert len([o for o in outcomes if o.detail.startswith("started")]) == 1, outcomes  # one rack run
    runs = [e async for e in client.list_workflows("WorkflowType = 'RackRemediation' OR WorkflowType = "
                                                   "'NodeRemediation'") if e.id.startswith(("rack-remediation/lab/",
                                                                                           "remediation/lab/"))]  # fmt: skip
    assert [r.id for r in runs if r.id.startswith("remediation/lab/") and r.id.split("/")[-1] in nodes] == []

    # Every tray cycled once, in order; nothing else powered.
    history = fabric.history(RACK)
    assert history is not None and history.recovered_at is not None
    switches = FLEET.switch_tray_names(RACK)
    assert [(p.tray, p.power) for p in history.power] == (
        [(n, "Off") for n in nodes] + [(s, "Off") for s in switches] + [(s, "On") for s in switches]
        + [(n, "On") for n in nodes])  # fmt: skip
    async with BmcAdmin(tray_bmcs.url) as admin:
        resets = [e for e in await admin.audit(writes=True) if e.get("reset_type")]
    assert sorted({e["server"] for e in resets}) == sorted([*nodes, *switches])
    assert all(len([e for e in resets if e["server"] == t]) == 2 for t in [*nodes, *switches])

    # Out of service at once, within the budget: every cordon before the first power-off; all back together.
    writes = await writes_to_nodes(k8s, since)
    cordoned_at: dict[str, int] = {}
    uncordoned_at: dict[str, int] = {}
    for e in writes:  # the first write that left each node cordoned, and the first after it that left it not
        if unschedulable_after(e) is True:
            cordoned_at.setdefault(e["name"], e["seq"])
        elif unschedulable_after(e) is False and e["name"] in cordoned_at:
            uncordoned_at.setdefault(e["name"], e["seq"])
    assert sorted(cordoned_at) == sorted(nodes) == sorted(uncordoned_at)
    assert max(cordoned_at.values()) < min(uncordoned_at.values())
    others = {n for r, ns in layout.items() if r != RACK for n in ns}  # no other rack touched
    assert not [e for e in writes if e["name"] in others and unschedulable_after(e) is not None]
    assert "passed" in result.domain_check
