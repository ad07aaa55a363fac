"""Task priority and fairness (workflows/priorities.py), read back from the histories: an operator's
NodeMaintenance and the budget entity at 1, a rollout's own calls, batches and node updates at 4 with the cluster's
fairness key. (Remediation at 2: tests/remediation/test_dcgm.py.)"""

from __future__ import annotations

import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from workflows import priorities
from workflows.disruption_budget import budget_workflow_id
from workflows.rollout import Rollout

from tests.kube_helpers import fleet_objects
from tests.rollout_helpers import JOBS_FAST, REBOOT_SECONDS, rollout_fleet, rollout_spec
from tests.test_node_maintenance import maintenance
from tests.test_node_maintenance import start as start_maintenance

pytestmark = pytest.mark.timeout(120)

SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
CHILD = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
STARTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED


async def scheduled(client: Client, workflow_id: str) -> dict[str, tuple[int, str]]:
    """(priority key, fairness key) of each activity type the run scheduled, and of each child (by workflow type)."""
    seen: dict[str, tuple[int, str]] = {}
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == SCHEDULED:
            a = event.activity_task_scheduled_event_attributes
            seen[a.activity_type.name] = (a.priority.priority_key, a.priority.fairness_key)
        elif event.event_type == CHILD:
            a = event.start_child_workflow_execution_initiated_event_attributes
            seen[f"child {a.workflow_type.name}"] = (a.priority.priority_key, a.priority.fairness_key)
    return seen


async def children(client: Client, workflow_id: str, workflow_type: str) -> list[str]:
    """The IDs of the children of that type the run started."""
    found = []
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == CHILD:
            a = event.start_child_workflow_execution_initiated_event_attributes
            if a.workflow_type.name == workflow_type:
                found.append(a.workflow_id)
    return found


async def started_priority(client: Client, workflow_id: str) -> tuple[int, str]:
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == STARTED:
            p = event.workflow_execution_started_event_attributes.priority
            return p.priority_key, p.fairness_key
    raise AssertionError(f"{workflow_id} has no start event")


def test_the_choices():
    assert priorities.OPERATOR.priority_key < priorities.REMEDIATION_KEY < 3 < priorities.ROLLOUT_KEY
    assert priorities.rollout("lab").fairness_key == "rollout/lab"
    assert len(priorities.rollout("c" * 100).fairness_key.encode()) == 64


async def test_an_operator_s_maintenance_runs_at_operator_priority(client, kube_worker, k8s):
    await k8s.seed(fleet_objects())
    handle = await start_maintenance(client, kube_worker, maintenance("node-02", uncordon_after=True))
    assert (await handle.result()).outcome == "completed"
    seen = await scheduled(client, handle.id)
    for call in ("cordon_node", "plan_drain", "uncordon_node"):
        assert seen[call] == (priorities.OPERATOR.priority_key, ""), (call, seen)
    # The disruption budget entity this run asked for a lease: its own workflow tasks at operator priority too.
    assert (await started_priority(client, budget_workflow_id("lab")))[0] == priorities.OPERATOR.priority_key


async def test_a_rollout_s_calls_batches_and_nodes_run_below_with_its_cluster_s_fairness_key(client, kube_worker, k8s):
    await k8s.seed(rollout_fleet({"a": 2}))
    await k8s.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS)
    spec = rollout_spec("prio")
    handle = await client.start_workflow(Rollout.run, spec, id=f"{spec.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                         task_queue=kube_worker.task_queue)  # fmt: skip
    assert (await handle.result()).outcome == "completed"
    want = (priorities.ROLLOUT_KEY, "rollout/lab")
    seen = await scheduled(client, handle.id)
    assert seen["list_nodes_page"] == want and seen["child RolloutBatch"] == want
    batch = (await children(client, handle.id, "RolloutBatch"))[0]
    assert (await scheduled(client, batch))["child NodeUpdate"] == want
    # A node update's stages and drain carry no priority of their own: they inherit its start's.
    assert await started_priority(client, f"{handle.id}/a-01") == want
