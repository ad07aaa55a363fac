"""Task priority and fairness (workflows/common/priorities.py), read back from the histories: an operator's
NodeMaintenance and the budget entity at 1, a rollout's own calls, batches and node updates at 4 with the cluster's
fairness key (remediation at 2: tests/workflows/remediation/test_dcgm.py); and what a backlogged queue dispatches first."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.conftest import DEV_SERVER_STARTUP, temporal_binary
from tests.kube_helpers import fleet_objects, wait_for
from tests.workflows.maintenance.test_node_maintenance import maintenance
from tests.workflows.maintenance.test_node_maintenance import start as start_maintenance
from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS, rollout_fleet, rollout_spec
from workflows.budget.leases import budget_workflow_id
from workflows.common import priorities
from workflows.rollout.rollout import Rollout

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
            child = event.start_child_workflow_execution_initiated_event_attributes
            seen[f"child {child.workflow_type.name}"] = (child.priority.priority_key, child.priority.fairness_key)
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
    # A node's stages and drain, which its batch runs, carry no priority of their own: they inherit the batch's.
    assert (await scheduled(client, batch))["run_node_stages"] == (0, "")
    assert await started_priority(client, batch) == want


# ---------------------------------------------------------------- dispatch order on a backlogged queue

ORDER: list[str] = []


@activity.defn(name="priority_probe")
async def priority_probe(label: str) -> None:
    ORDER.append(label)


@workflow.defn(name="PriorityBacklog", sandboxed=False)
class PriorityBacklog:
    """Eight rollout tasks of cluster a, eight of cluster b, then one remediation task, all on a queue nobody polls
    yet: the backlog a busy worker pool would have."""

    @workflow.run
    async def run(self, queue: str) -> None:
        calls = [workflow.start_activity(priority_probe, f"{cluster}{i}", task_queue=queue,
                                         start_to_close_timeout=timedelta(seconds=30),
                                         priority=priorities.rollout(cluster))
                 for cluster in ("a", "b") for i in range(8)]  # fmt: skip
        await workflow.sleep(timedelta(milliseconds=500))  # after the rollout's, as it would come later
        calls.append(workflow.start_activity(priority_probe, "remediation", task_queue=queue,
                                             start_to_close_timeout=timedelta(seconds=30),
                                             priority=priorities.remediation("a")))  # fmt: skip
        await asyncio.gather(*calls)


async def test_a_backlog_dispatches_remediation_first_and_each_cluster_s_rollout_its_share():
    # One partition, so the order is the matcher's (a queue's partitions are otherwise drawn at random).
    one_partition = ["--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
                     "--dynamic-config-value", "matching.numTaskqueueWritePartitions=1"]  # fmt: skip
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        ui=False,
        dev_server_extra_args=["--dynamic-config-value", priorities.FAIRNESS_DYNAMIC_CONFIG, *one_partition],
    ) as env:
        ORDER.clear()
        async with Worker(env.client, task_queue="backlog", workflows=[PriorityBacklog]):
            handle = await env.client.start_workflow(PriorityBacklog.run, "probes", id="backlog", task_queue="backlog")

            async def backlog():
                described = await env.client.get_workflow_handle("backlog").describe()
                return described.raw_description.pending_activities if \
                    len(described.raw_description.pending_activities) == 17 else None  # fmt: skip

            await wait_for(backlog, what="17 activities scheduled")
            async with Worker(env.client, task_queue="probes", activities=[priority_probe], max_concurrent_activities=1,
                              max_concurrent_activity_task_polls=1):  # fmt: skip
                await handle.result()
    assert ORDER[0] == "remediation", ORDER
    # Fairness: the two clusters' rollouts take turns (in order of scheduling, all eight of a's would come in a row).
    longest = run = 1
    for before, label in itertools.pairwise(ORDER):
        run = run + 1 if label[0] == before[0] else 1
        longest = max(longest, run)
    assert longest <= 4, ORDER
