"""FleetHealthSweep on a real dev server: what it finds (node conditions, host agents' GPU checks, BMC health
rollups), that two sweeps at once start no duplicate NodeRemediation, and that a sick NVLink domain gets one
RackRemediation instead."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime

import pytest

from activities.kube.topology import CLIQUE_LABEL, TOPOGRAPH_ACCELERATOR_LABEL
from activities.redfish import BmcRef
from starter.questions import current_details
from tests.kube_helpers import wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.helpers import fast_settings, fleet, started_since, stop_remediation
from tests.workflows.remediation.rack_stand_in import RackStandIn
from tests.workflows.remediation.test_rack_remediation import DOMAINS, racks
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import LeaseRelease, budget_workflow_id
from workflows.remediation.health_sweep import FleetHealthSweep
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.policy import remediation_workflow_id
from workflows.remediation.rack_models import rack_workflow_id
from workflows.remediation.sweep_models import FleetHealthSweepInput

pytestmark = pytest.mark.timeout(180)


async def test_two_sweeps_at_once_start_each_remediation_once(client, rem_worker, k8s, hosts, bmc_admin, names,
                                                             burnin_bmcs):  # fmt: skip
    n = {i: names[i - 1] for i in range(1, 7)}
    await k8s.seed(fleet(names[:6], conditions={
        n[1]: [{"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"}],
        n[2]: [{"type": "GpuHealthy", "status": "False", "reason": "XidErrors"}],
        n[6]: [{"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"}],
    }, cordoned={n[6]: "rollout/lab/r-1"}))  # fmt: skip
    await hosts.add(n[3], {"pending_remaps": [1]})  # only its host agent knows
    await hosts.add(n[5])  # healthy, with an agent
    await bmc_admin.add_sel(n[4], "Critical", "CPU 1 machine check")  # only its BMC knows
    bmcs = {n[i]: BmcRef(url=burnin_bmcs.bmc_urls[n[i]]) for i in (4, 5)}
    # Children wait for an operator at their first step, so they are still running when the second sweep looks.
    settings = fast_settings(require_approval_for=["restart-gpu-services", "reset-gpu", "power-cycle"],
                             approval_timeout=3600)  # fmt: skip
    # Four of six nodes unhealthy: min_healthy (51 %) would refuse them all; this test is about what is found.
    inp = FleetHealthSweepInput(clusters=["lab"], label_selector="", bmcs=bmcs, agent_timeout=1,
                                max_remediations=10, min_healthy={"percent": 0}, remediation=settings)  # fmt: skip
    sweeps = [
        await client.start_workflow(FleetHealthSweep.run, inp, id=f"{inp.workflow_id()}/{who}-{uuid.uuid4().hex[:6]}",
                                    task_queue=rem_worker.task_queue)
        for who in ("scheduled", "manual")
    ]  # fmt: skip
    try:
        results = await asyncio.gather(*(s.result() for s in sweeps))

        # What each found: four unhealthy nodes of four kinds, one left to its rollout, one healthy.
        for r in results:
            (c,) = r.clusters
            assert c.nodes == 6 and c.healthy == 1 and c.error is None
            why = {d.node: d for d in c.unhealthy}
            assert why[n[1]].reasons == ["KernelDeadlock (DockerHung)"]
            assert why[n[2]].reasons == ["GpuHealthy=False (XidErrors)"]
            assert why[n[3]].reasons[0].startswith("GPU check: remap_pending GPU1")
            assert why[n[4]].reasons == ["BMC health rollup Critical"]
            assert why[n[6]].action == "skip" and "cordoned by rollout/lab/r-1" in why[n[6]].note
            assert "host agent unavailable" in why[n[1]].note
            assert c.agents_unavailable == 3  # 01, 02, 04 (06 is not probed)
        # Each unhealthy node's remediation was started by exactly one of the two sweeps.
        started: dict[str, list[str]] = {}
        for r in results:
            for entry in r.remediations:
                started.setdefault(entry.node, []).append(entry.status)
        assert sorted(started) == [n[1], n[2], n[3], n[4]]
        for node, statuses in started.items():
            assert sorted(statuses) == ["already-running", "started"], (node, statuses)
        details = await current_details(sweeps[0])
        assert "started" in details and f"`remediation/lab/{n[1]}`" in details

        # One running run per node, found by its derived ID (earlier tests' closed runs of the same node aside).
        for i in (1, 2, 3, 4):
            wf_id = f"remediation/lab/{n[i]}"

            async def runs(wf_id=wf_id):
                found = [
                    w async for w in client.list_workflows(f"WorkflowId = '{wf_id}' AND ExecutionStatus = 'Running'")
                ]
                return found or None

            found = await wait_for(runs, what=f"{wf_id} in visibility")
            assert len(found) == 1
            status = await client.get_workflow_handle(wf_id).query(NodeRemediation.status)
            assert status.phase in (
                "starting",
                "waiting-for-budget",
                "cordoning",
                "draining",
                "diagnosing",
                "awaiting-approval",
            )

        # A third sweep, while they run: nothing new started.
        third = await client.execute_workflow(FleetHealthSweep.run, inp,
                                              id=f"{inp.workflow_id()}/third-{uuid.uuid4().hex[:6]}",
                                              task_queue=rem_worker.task_queue)  # fmt: skip
        assert {e.status for e in third.remediations} == {"already-running"}
    finally:
        for i in (1, 2, 3, 4):
            wf_id = f"remediation/lab/{n[i]}"
            with contextlib.suppress(Exception):  # not started (the test failed earlier)
                await client.get_workflow_handle(wf_id).terminate("test over")
            with contextlib.suppress(Exception):  # the budget would recover them later; the next test needs them now
                await client.get_workflow_handle(budget_workflow_id("lab")).execute_update(
                    DisruptionBudget.release, LeaseRelease(node=n[i], holder=wf_id, reason="test over")
                )


async def test_max_remediations_and_dry_run(client, rem_worker, k8s, names):
    p = names
    sick = [{"type": "KernelDeadlock", "status": "True"}]
    await k8s.seed(fleet(names[:3], conditions={p[0]: sick, p[1]: sick}, not_ready=[p[2]]))
    base = dict(
        clusters=["lab"],
        checks={"host_agent": False, "bmc": False},
        remediation=fast_settings(),
        min_healthy={"percent": 0},
    )  # none of the three is healthy
    dry = await client.execute_workflow(
        FleetHealthSweep.run, FleetHealthSweepInput(**base, dry_run=True), id=f"sweep-dry-{uuid.uuid4().hex[:6]}",
        task_queue=rem_worker.task_queue)  # fmt: skip
    assert [(e.node, e.status) for e in dry.remediations] == [(p[0], "dry-run"), (p[1], "dry-run"), (p[2], "dry-run")]
    assert dry.remediations[2].reasons[0].startswith("NotReady for ")
    none = await client.execute_workflow(
        FleetHealthSweep.run, FleetHealthSweepInput(**base, max_remediations=0), id=f"sweep-none-{uuid.uuid4().hex[:6]}",
        task_queue=rem_worker.task_queue)  # fmt: skip
    assert {e.status for e in none.remediations} == {"deferred"}
    assert "max 0 remediations per sweep" in none.remediations[0].detail
    # The schedule's short form: one cluster.
    assert FleetHealthSweepInput.model_validate({"cluster": "lab"}).clusters == ["lab"]


async def test_a_sick_domain_gets_one_rack_remediation_and_a_lone_node_its_own(client, rack_worker, k8s, names):
    """Two racks of four: three nodes of rack-east unhealthy with their clique label gone, one node of rack-west; a second
    sweep while rack-east's run runs starts nothing new."""
    where = racks(names)
    rack_a, rack_b = ([n for n, r in where.items() if r == rack] for rack in ("rack-east", "rack-west"))
    sick = [{"type": "GpuHealthy", "status": "False", "reason": "XidErrors"}]
    labels = {n: {TOPOGRAPH_ACCELERATOR_LABEL: r} | ({} if n in rack_a[:3] else {CLIQUE_LABEL: f"{DOMAINS[r]}.1"})
              for n, r in where.items()}  # fmt: skip
    await k8s.seed(fleet(list(where), labels=labels, conditions={n: sick for n in [*rack_a[:3], rack_b[0]]}))
    since = datetime.now(UTC)
    rack_id = rack_workflow_id("lab", "rack-east")
    # max_remediations 1 (the default) bounds NodeRemediations: a domain's nodes are held and escalated whole.
    inp = FleetHealthSweepInput(clusters=["lab"], checks={"host_agent": False, "bmc": False},
                                min_healthy={"percent": 0}, slice_size=3,  # a domain split over slices
                                remediation=fast_settings(require_approval_for=["restart-gpu-services"],
                                                          approval_timeout=3600))  # fmt: skip

    async def sweep(who: str):
        handle = await client.start_workflow(FleetHealthSweep.run, inp, id=f"{inp.workflow_id()}/{who}-"
                                             f"{uuid.uuid4().hex[:6]}", task_queue=rack_worker.task_queue)  # fmt: skip
        return handle, await handle.result()

    try:
        handle, first = await sweep("racks")
        entries = {e.node: e for e in first.remediations}
        assert sorted(entries) == sorted([*rack_a[:3], rack_b[0]])
        for node in rack_a[:3]:
            assert entries[node].status == "escalated" and entries[node].workflow_id == rack_id, entries[node]
        assert entries[rack_a[0]].detail == ("its domain remediated whole: 3 of 4 nodes unhealthy (share 0.5); "
                                             "fabric fault: clique label gone from 3 nodes")  # fmt: skip
        assert entries[rack_b[0]].status == "started", entries[rack_b[0]]
        assert first.remediation_counts == {"escalated": 3, "started": 1}
        assert "escalated to their domain's RackRemediation 3" in await current_details(handle)

        started = await client.get_workflow_handle(rack_id).query(RackStandIn.started_with)
        assert started.domain == "rack-east" and started.reason == entries[rack_a[0]].detail.split(": ", 1)[1]
        assert started.node_remediation.require_approval_for == ["restart-gpu-services"]
        assert await started_since(client, rack_id, since)
        for node in rack_a:
            assert not await started_since(client, remediation_workflow_id("lab", node), since), node
        await record_history(handle, "fleet_health_sweep_escalated")

        _, second = await sweep("again")
        again = {e.node: e for e in second.remediations}
        for node in rack_a[:3]:
            assert again[node].status == "already-running" and again[node].workflow_id == rack_id, again[node]
        assert again[rack_b[0]].status == "already-running"
        for node in rack_a:
            assert not await started_since(client, remediation_workflow_id("lab", node), since), node
    finally:
        with contextlib.suppress(Exception):  # ended now: the tests' worker goes with the test
            await client.get_workflow_handle(rack_id).terminate("test over")
        await stop_remediation(client, "lab", rack_b[0])
