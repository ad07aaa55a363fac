"""A NodeRemediation standing down for its domain's RackRemediation (workflows/remediation/stand_down.py), on a real
dev server, the Kubernetes emulator and the cluster's DisruptionBudget: untouched while it waits for its lease; past
its cordon, at its next step boundary, the cordon handed to the rack run."""

from __future__ import annotations

import pytest

from activities.kube.models import CORDONED_BY
from activities.node_health import LAST_REMEDIATION_ANNOTATION
from tests.kube_helpers import declare_lab_budget, read_node, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.helpers import fast_settings, fleet
from tests.workflows.remediation.test_fault_events import cordoned_at
from tests.workflows.remediation.test_node_remediation import awaiting_approval, leases
from workflows.budget.budget import Budget
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import LeaseRelease, LeaseRequest, budget_workflow_id
from workflows.budget.models import BudgetChange
from workflows.remediation.models import NodeRemediationInput
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.rack_models import StandDown, rack_workflow_id

pytestmark = pytest.mark.timeout(120)
SICK = [{"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"}]
NO_PROBES = {"host_agent": False, "bmc": False}
RACK_RUN = rack_workflow_id("lab", "rack-a")
ORDER = StandDown(by=RACK_RUN, reason="rack rack-a is remediated whole")
STOOD_DOWN = f"stood down: {RACK_RUN} remediates the node's whole NVLink domain (rack rack-a is remediated whole)"


async def start(client, worker, node: str, **settings):
    inp = NodeRemediationInput(cluster="lab", node=node, reason="KernelDeadlock (DockerHung)", checks=NO_PROBES,
                               **fast_settings(disruption_budget=True, **settings))  # fmt: skip
    return await client.start_workflow(NodeRemediation.run, inp, id=inp.workflow_id(), task_queue=worker.task_queue)


def marked(node) -> bool:
    return LAST_REMEDIATION_ANNOTATION in (node.metadata.annotations or {})


async def test_a_run_waiting_for_its_lease_stands_down_untouched(client, rem_worker, k8s, core, names):
    node, other = names[6:8]  # not the servers test_fault_events expects never remediated
    await k8s.seed(fleet(names[:8], conditions={node: SICK}))
    await declare_lab_budget(client, rem_worker.task_queue)
    entity = client.get_workflow_handle(budget_workflow_id("lab"))
    before = (await entity.query(DisruptionBudget.state)).budget
    one = BudgetChange(budget=Budget(count=1), by="test", reason="one node at once")
    await entity.execute_update(DisruptionBudget.set_budget, one)
    full = LeaseRequest(node=other, holder=entity.id, reason="the budget's one node, taken")  # a running holder
    try:
        assert (await entity.execute_update(DisruptionBudget.acquire, full)).state == "granted"
        handle = await start(client, rem_worker, node)

        async def queued():
            return node in [q.node for q in (await entity.query(DisruptionBudget.state)).queue]

        await wait_for(queued, what=f"{node}'s remediation queued for a lease")
        await handle.signal(NodeRemediation.stand_down, ORDER)
        result = await handle.result()

        assert result.outcome == "stood-down" and result.steps == [], result
        assert result.note == f"{STOOD_DOWN}; the node untouched"
        assert (await handle.query(NodeRemediation.progress)).phase == "stood-down"
        # The request withdrawn; never cordoned, drained or marked.
        state = await entity.query(DisruptionBudget.state)
        assert node not in [q.node for q in state.queue] + [lease.node for lease in state.leases]
        assert await cordoned_at(k8s, node) is None
        assert not marked(await read_node(core, node))
        await record_history(handle, "node_remediation_stood_down_in_queue")
    finally:
        await entity.execute_update(DisruptionBudget.release, LeaseRelease(node=other, holder=entity.id))
        await entity.execute_update(DisruptionBudget.set_budget, BudgetChange(budget=before, by="test", reason="back"))


async def test_a_run_past_its_cordon_hands_it_to_the_rack_run_at_its_next_step(client, rem_worker, k8s, core, names):
    node = names[5]
    await k8s.seed(fleet(names[:8], conditions={node: SICK}))
    await declare_lab_budget(client, rem_worker.task_queue)
    handle = await start(client, rem_worker, node, require_approval_for=["restart-gpu-services"], approval_timeout=3600)
    await awaiting_approval(handle)  # cordoned, drained, its first step waiting for an operator
    assert (await read_node(core, node)).metadata.annotations[CORDONED_BY] == handle.id
    await handle.signal(NodeRemediation.stand_down, ORDER)
    result = await handle.result()

    assert result.outcome == "stood-down" and result.steps == [], result
    assert result.note == f"{STOOD_DOWN}; its cordon handed over"
    n = await read_node(core, node)
    assert n.spec.unschedulable and n.metadata.annotations[CORDONED_BY] == RACK_RUN  # never schedulable between
    assert not [lease for lease in await leases(client) if lease.node == node]  # its lease returned
    assert not marked(n)
    await record_history(handle, "node_remediation_stood_down")
