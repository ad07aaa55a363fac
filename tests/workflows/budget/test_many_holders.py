"""Fifty lease holders of every kind on one cluster's disruption budget, on a real dev server.

A rollout batch of 40 nodes, six NodeMaintenance runs and four NodeRemediation runs share a budget of 10
nodes. Whether the budget held is judged from the emulator's audit log; that nobody was throttled, from the
worker's log and the entity's history (no Workflow Update at all).
"""

from __future__ import annotations

import logging
import uuid

import pytest

from tests.carried_helpers import continued_runs
from tests.kube_helpers import read_node
from tests.workflows.budget.test_disruption_budget import (
    max_out_of_service,
    results_watching_the_queue,
    start_budget,
    state_where,
)
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS, rollout_fleet, rollout_spec
from workflows.maintenance.node_maintenance import NodeMaintenance, NodeMaintenanceInput
from workflows.remediation.models import NodeRemediationInput
from workflows.remediation.node_remediation import NodeRemediation
from workflows.rollout.rollout import Rollout

BUDGET = 10
THROTTLED = ("ResourceExhausted", "RESOURCE_EXHAUSTED", "in-flight updates", "update was aborted")

# A worker killed or an API failing under the workflows: replay what they wrote (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("replay_histories")


def history_counts(history) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in history.events:
        kind = event.WhichOneof("attributes") or "unknown"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


async def all_runs(client, query: str) -> list:
    """The history of every run (continue-as-new included) of the workflows the visibility query names (which may
    lag on a loaded server: exact counts come from tests/carried_helpers.py `continued_runs`)."""
    return [await client.get_workflow_handle(e.id, run_id=e.run_id).fetch_history()
            async for e in client.list_workflows(query)]  # fmt: skip


async def test_fifty_holders_share_one_budget_without_throttling(client, kube_worker, k8s, core, caplog):
    caplog.set_level(logging.WARNING)
    await k8s.seed(rollout_fleet({"a": 40, "b": 10}))
    await k8s.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS)
    entity = await start_budget(client, kube_worker, {"count": BUDGET})
    tag = uuid.uuid4().hex[:6]

    policy = {"default": {"budget": {"count": 40}, "strategy": {"fixed": {"initialBatch": 40}}}}
    spec = rollout_spec("many-holders", policy=policy, nodeSelectors={"matchLabels": {"pool": "a"}})
    rollout = await client.start_workflow(Rollout.run, spec, id=f"{spec.workflow_id()}-{tag}",
                                          task_queue=kube_worker.task_queue)  # fmt: skip
    maintenances = []
    for i in range(1, 7):
        inp = NodeMaintenanceInput(cluster="lab", node=f"b-{i:02d}", reason="many holders", uncordon_after=True,
                                   drain={"eviction_retry_interval": 0.5, "timeout": 60})  # fmt: skip
        maintenances.append(await client.start_workflow(NodeMaintenance.run, inp, id=f"{inp.workflow_id()}/{tag}",
                                                        task_queue=kube_worker.task_queue))  # fmt: skip
    remediations = []
    for i in range(7, 11):
        # No BMC and no host agent: the ladder has nothing to try, so the node is quarantined and stays
        # cordoned, counting against the budget for the rest of the test (out of service for another reason).
        inp = NodeRemediationInput(cluster="lab", node=f"b-{i:02d}", reason="many holders", steps=["power-cycle"],
                                   checks={"host_agent": False, "bmc": False},
                                   drain={"eviction_retry_interval": 0.5, "timeout": 60})  # fmt: skip
        remediations.append(await client.start_workflow(NodeRemediation.run, inp, id=inp.workflow_id(),
                                                        task_queue=kube_worker.task_queue))  # fmt: skip

    done, longest_queue = await results_watching_the_queue(entity, [rollout, *maintenances, *remediations], 240)

    rolled, maintained, remediated = done[0], done[1:7], done[7:]
    assert rolled.outcome == "completed" and rolled.counts == {"complete": 40}, rolled
    assert all(r.outcome == "completed" and r.uncordoned for r in maintained), maintained
    assert all(r.outcome == "quarantined" for r in remediated), remediated
    assert longest_queue >= 1, "holders waited for one another"
    assert max_out_of_service(await k8s.audit()) <= BUDGET
    await state_where(entity, lambda s: not s.leases and not s.queue, "every lease returned")
    for i in range(7, 11):  # quarantined: still cordoned, so still counted, without a lease
        assert (await read_node(core, f"b-{i:02d}")).spec.unschedulable

    throttled = [logging.Formatter().format(r) for r in caplog.records]
    throttled = [line for line in throttled if any(word in line for word in THROTTLED)]
    assert not throttled, throttled[:3]

    entity_runs = await continued_runs(client, entity)  # earlier tests' entities had the same ID
    entity_counts = [history_counts(h) for h in entity_runs]
    updates = sum(c.get("workflow_execution_update_accepted_event_attributes", 0) for c in entity_counts)
    assert updates == 0, "no Workflow Update reaches the entity"
    await record_history(remediations[0], "node_remediation_quarantine_lease")

    # What the budget cost, for the record (no assertion: the counts depend on how the holders interleave).
    batches = await all_runs(client, f"WorkflowType = 'RolloutBatch' AND WorkflowId STARTS_WITH '{rollout.id}/'")
    entity_events = sum(len(h.events) for h in entity_runs)
    print(f"\nentity: {entity_events} events in {len(entity_runs)} runs, {entity_events / 50:.1f} per holder: "
          f"{_total(entity_counts)}\nbatches: {sum(len(h.events) for h in batches)} events for 40 nodes; NodeMaintenance: "
          f"{len((await maintenances[0].fetch_history()).events)} events; longest queue {longest_queue}")  # fmt: skip


def _total(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for kind, n in c.items():
            total[kind.removesuffix("_event_attributes")] = total.get(kind.removesuffix("_event_attributes"), 0) + n
    return total
