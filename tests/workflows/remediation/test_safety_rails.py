"""The remediation safety rails on a real dev server against the Kubernetes emulator: a remediation storm trips the
cluster's circuit breaker with no further node taken out, and the sweep refuses until an operator resets it;
min_healthy refuses; the per-node cooldown (from the annotation a finished remediation leaves) and the opt-out
label are honoured. Which nodes went out of service is judged from the emulator's audit log."""

from __future__ import annotations

import contextlib
import json
import uuid

import pytest

from activities.node_health import LAST_REMEDIATION_ANNOTATION
from starter.questions import current_details
from tests.kube_helpers import declare_lab_budget, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.helpers import fast_settings, fleet
from tests.workflows.rollout.helpers import availability_timeline
from workflows.budget.breaker import BreakerReset
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import budget_workflow_id
from workflows.remediation.health_sweep import FleetHealthSweep
from workflows.remediation.models import NodeRemediationInput
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.policy import OPT_OUT_LABEL
from workflows.remediation.sweep_models import FleetHealthSweepInput

pytestmark = pytest.mark.timeout(180)
SICK = [{"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"}]
NO_PROBES = {"host_agent": False, "bmc": False}
EVERY_STEP = ["restart-gpu-services", "reset-gpu", "power-cycle"]


async def sweep(client, worker, tag: str, **fields):
    inp = FleetHealthSweepInput(clusters=["lab"], checks=NO_PROBES, **fields)
    handle = await client.start_workflow(FleetHealthSweep.run, inp, task_queue=worker.task_queue,
                                         id=f"{inp.workflow_id()}/{tag}-{uuid.uuid4().hex[:6]}")  # fmt: skip
    return handle, await handle.result()


def taken_out(audit: list[dict]) -> set[str]:
    """The nodes that went out of service at any moment the API server saw."""
    return {n for _, state in availability_timeline(audit) for n, down in state.items() if down}


async def test_a_remediation_storm_trips_the_breaker_and_a_reset_resumes(client, rem_worker, k8s, names):
    nodes = names[:6]
    failing = nodes[:4]  # more than half of the cluster at once
    await k8s.seed(fleet(nodes, conditions={n: SICK for n in failing}))
    # Children wait for an operator at their first step, so the nodes they took stay out of service; a budget
    # of the whole cluster leaves the breaker (50 % within 5 minutes, the default) the only limit.
    settings = fast_settings(require_approval_for=EVERY_STEP, approval_timeout=3600, budget={"count": 6})
    await declare_lab_budget(client, rem_worker.task_queue, {"count": 6})  # the operator's: whole cluster, too
    storm = dict(max_remediations=10, min_healthy={"percent": 0}, remediation=settings)
    ids = [f"remediation/lab/{n}" for n in failing]
    try:
        first, found = await sweep(client, rem_worker, "storm", **storm)
        assert {e.node: e.status for e in found.remediations} == {n: "started" for n in failing}

        async def settled():
            phases = {i: (await client.get_workflow_handle(i).query(NodeRemediation.status)).phase for i in ids}
            return phases if sorted(phases.values()) == ["awaiting-approval"] * 3 + ["refused"] else None

        phases = await wait_for(settled, what="three remediations holding their nodes, the fourth refused", timeout=90)
        (refused_id,) = [i for i, p in phases.items() if p == "refused"]
        refused_run = client.get_workflow_handle_for(NodeRemediation.run, refused_id)
        refused = await refused_run.result()
        assert refused.outcome == "refused" and refused.steps == [] and not refused.uncordoned
        assert "remediation circuit breaker tripped" in refused.note and "3 of 6 nodes" in refused.note
        # No further node was taken out: only the three granted went out of service, ever.
        refused_node = refused_id.rsplit("/", 1)[1]
        assert taken_out(await k8s.audit()) == set(failing) - {refused_node}

        # The next sweep starts nothing, and says why.
        second, held = await sweep(client, rem_worker, "tripped", **storm)
        (c,) = held.clusters
        assert c.refused and "remediation circuit breaker tripped" in c.refused
        assert {e.status for e in held.remediations} == {"refused"} and len(held.remediations) == 4
        assert "no remediation" in await current_details(second)
        assert taken_out(await k8s.audit()) == set(failing) - {refused_node}

        # An operator resets the breaker: the refused node's remediation starts and takes its node.
        entity = client.get_workflow_handle(budget_workflow_id("lab"))
        await entity.execute_update(DisruptionBudget.reset_breaker, BreakerReset(by="ops", reason="storm understood"))
        _, resumed = await sweep(client, rem_worker, "reset", **storm)
        assert {e.node: e.status for e in resumed.remediations} == {
            n: "started" if n == refused_node else "already-running" for n in failing
        }

        async def taken():
            status = await client.get_workflow_handle(refused_id).query(NodeRemediation.status)
            return status.phase == "awaiting-approval" and status.lease

        await wait_for(taken, what="the resumed remediation holding its node")
        assert taken_out(await k8s.audit()) == set(failing)
        await record_history(first, "fleet_health_sweep_held")
        await record_history(second, "fleet_health_sweep_breaker_refused")
        await record_history(refused_run, "node_remediation_breaker_refused")
    finally:
        for wf_id in ids:
            with contextlib.suppress(Exception):  # closed already, or never started
                await client.get_workflow_handle(wf_id).terminate("test over")


async def test_min_healthy_cooldown_and_opt_out_are_honoured(client, rem_worker, k8s, core, names):
    nodes = names[:8]
    opted, remediated, sick = nodes[:3]
    seed = fleet(nodes, conditions={n: SICK for n in (opted, remediated, sick)},
                 labels={opted: {OPT_OUT_LABEL: "false"}})  # fmt: skip
    await k8s.seed(seed)
    # `remediated` had a remediation just now: nothing on the ladder can run here, so it ends quarantined, and
    # leaves its mark on the node.
    inp = NodeRemediationInput(cluster="lab", node=remediated, reason="earlier", checks=NO_PROBES,
                               **fast_settings(steps=["power-cycle"]))  # fmt: skip
    earlier = await client.start_workflow(NodeRemediation.run, inp, id=inp.workflow_id(),
                                          task_queue=rem_worker.task_queue)  # fmt: skip
    assert (await earlier.result()).outcome == "quarantined"
    mark = (await core.read_node(remediated)).metadata.annotations[LAST_REMEDIATION_ANNOTATION]
    assert json.loads(mark)["outcome"] == "quarantined" and json.loads(mark)["by"] == inp.workflow_id()
    await record_history(earlier, "node_remediation_marked_quarantined")
    # An operator lifted the quarantine; the node is still sick. (A fresh seed: the mark carried over.)
    for obj in seed:
        if obj["kind"] == "Node" and obj["metadata"]["name"] == remediated:
            obj["metadata"]["annotations"][LAST_REMEDIATION_ANNOTATION] = mark
    await k8s.seed(seed)

    # 5 of 8 healthy is min_healthy's 51 %: the sweep goes ahead, but leaves the opted-out and the cooling node.
    _, result = await sweep(client, rem_worker, "rails", dry_run=True, remediation=fast_settings())
    (c,) = result.clusters
    why = {d.node: d for d in c.unhealthy}
    assert c.healthy == 5 and c.refused is None
    assert why[opted].action == "skip" and "opted out of automated remediation" in why[opted].note
    assert why[remediated].action == "skip" and why[remediated].note.startswith("cooling down: remediated ")
    assert "(quarantined)" in why[remediated].note and "cooldown 60m" in why[remediated].note
    assert [(e.node, e.status) for e in result.remediations] == [(sick, "dry-run")]
    # Without a cooldown the node is remediated again; the opted-out one never is.
    _, uncooled = await sweep(client, rem_worker, "no-cooldown", dry_run=True, cooldown=0, remediation=fast_settings())
    assert sorted(e.node for e in uncooled.remediations) == sorted([remediated, sick])

    # Asking for 6 healthy of 8: no remediation at all, and it says why.
    handle, refused = await sweep(client, rem_worker, "min-healthy", min_healthy={"percent": 70},
                                  remediation=fast_settings())  # fmt: skip
    (c,) = refused.clusters
    assert c.refused == "only 5 of 8 nodes healthy, fewer than min_healthy 70% (6): no remediation in this cluster"
    assert [(e.node, e.status, e.detail) for e in refused.remediations] == [(sick, "refused", c.refused)]
    assert refused.remediation_counts == {"refused": 1} and "no remediation" in await current_details(handle)
    assert (await core.read_node(sick)).spec.unschedulable is not True
