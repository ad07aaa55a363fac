"""An upgrade under Worker Versioning, as docs/production.md ("Upgrades") does it: build B polls beside build A, the
`temporal` CLI makes B current, a rollout running on A finishes on A (pinned), a new one runs on B, and the cluster's
DisruptionBudget entity moves to B (auto-upgrade). Each worker's identity names its build, so every workflow task and
activity of a run says which build ran it."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import uuid
from types import SimpleNamespace

from temporalio.api.enums.v1 import EventType
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion

from tests.conftest import temporal_binary
from tests.kube_helpers import wait_for
from tests.workflows.rollout.helpers import rollout_fleet, rollout_spec
from tests.workflows.rollout.test_rollout import lab_ready, start, status_where
from worker import registry
from worker.config import WorkerSettings
from workflows.rollout.models import ApproveRequest
from workflows.rollout.rollout import Rollout

TASK_EVENTS = (EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)


@contextlib.asynccontextmanager
async def build(client, kubeconfig_path, queue: str, version: WorkerDeploymentVersion):
    """One build of the worker polling `queue`, as `python -m worker` with MILLWRIGHT_DEPLOYMENT_NAME/_BUILD_ID."""
    registration = registry.build(WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0))
    async with registry.new_worker(client, registration, queue, version=version, identity=version.build_id):
        yield
    await registration.close()


async def set_current(address: str, version: WorkerDeploymentVersion) -> None:
    """The deploy step (deploy/README.md): make `version` current, once the server has seen it poll."""
    command = [temporal_binary(), "worker", "deployment", "set-current-version", "--address", address,
               "--deployment-name", version.deployment_name, "--build-id", version.build_id, "--yes"]  # fmt: skip

    async def made_current():
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
        return done.returncode == 0 or None

    await wait_for(made_current, what=f"{version.build_id} made current", timeout=60, interval=1)


async def builds_that_ran(handle) -> set[str]:
    """The identities of the workers that started this run's workflow and activity tasks."""
    ran = set()
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            ran.add(event.workflow_task_started_event_attributes.identity)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            ran.add(event.activity_task_started_event_attributes.identity)
    return ran


async def versioning(handle) -> tuple[int, str]:
    info = (await handle.describe()).raw_description.workflow_execution_info.versioning_info
    return info.behavior, info.deployment_version.build_id


async def test_a_running_rollout_finishes_on_its_build_while_a_new_one_starts_on_the_next(
    client, temporal_address, kubeconfig_path, k8s
):
    await lab_ready(k8s, rollout_fleet({"a": 4, "b": 2}))
    deployment, queue = f"millwright-upgrade-{uuid.uuid4().hex[:6]}", f"upgrade-{uuid.uuid4().hex[:8]}"
    a, b = (WorkerDeploymentVersion(deployment, f"build-{x}-{uuid.uuid4().hex[:4]}") for x in "ab")
    two_batches = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}
    worker = SimpleNamespace(task_queue=queue)  # what `start` needs of a worker

    async with build(client, kubeconfig_path, queue, a):
        await set_current(temporal_address, a)
        first = await start(client, worker, rollout_spec("on-build-a", policy=two_batches, approval="batch",
                                                         nodeSelectors={"matchLabels": {"pool": "a"}}))  # fmt: skip
        waiting = lambda s: (
            s.compartments.get("__default__") and s.compartments["__default__"].phase == ("waiting-for-approval")
        )
        await status_where(first, waiting, "the first approval")
        await first.execute_update(Rollout.approve_batch, ApproveRequest(approver="sre"))
        await status_where(first, lambda s: s.counts.get("complete") == 2 and waiting(s), "the second approval")

        async with build(client, kubeconfig_path, queue, b):
            await set_current(temporal_address, b)
            second = await start(
                client, worker, rollout_spec("on-build-b", nodeSelectors={"matchLabels": {"pool": "b"}})
            )
            await first.execute_update(Rollout.approve_batch, ApproveRequest(approver="sre"))
            done_first, done_second = await asyncio.gather(first.result(), second.result())
            budget = client.get_workflow_handle("disruption-budget/lab")
            # The entity takes the next node's release on B: its tasks since B became current run there.
            assert b.build_id in await builds_that_ran(budget)
            assert await versioning(budget) == (VersioningBehavior.AUTO_UPGRADE.value, b.build_id)

    assert done_first.counts == {"complete": 4} and done_second.counts == {"complete": 2}
    # The rollout started on A ran every task on A, its second batch after B was current; the new one only on B.
    assert await builds_that_ran(first) == {a.build_id}
    assert await versioning(first) == (VersioningBehavior.PINNED.value, a.build_id)
    assert await builds_that_ran(second) == {b.build_id}
    assert await versioning(second) == (VersioningBehavior.PINNED.value, b.build_id)
    # Its children (batches, node updates) are pinned to the build of the run that started them.
    async for child in client.list_workflows(f"RootWorkflowId = '{first.id}' AND WorkflowId != '{first.id}'"):
        assert await builds_that_ran(client.get_workflow_handle(child.id, run_id=child.run_id)) == {a.build_id}
