"""Continue-as-new, exercised: a dev server that suggests it after 20 events.

The rollout's parent and its batches must carry their state across runs and finish
exactly as an uninterrupted run would, with every run's history small.
"""

from __future__ import annotations

import uuid

from tests.conftest import SUGGEST_CONTINUE_AS_NEW_AFTER as SUGGEST_AFTER
from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS, rollout_fleet, rollout_spec
from worker import registry
from worker.config import WorkerSettings
from workflows.rollout.rollout import Rollout


async def test_rollout_and_batches_continue_as_new_and_finish(small_history_env, k8s, kubeconfig_path):
    await k8s.seed(rollout_fleet({"a": 8}))
    await k8s.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS)
    client = small_history_env.client
    registration = registry.build(WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0))
    policy = {"default": {"budget": {"count": 4}, "strategy": {"fixed": {"initialBatch": 4}}}}
    spec = rollout_spec("continued", policy=policy, maxInFlight=1)
    async with registry.new_worker(client, registration, f"can-{uuid.uuid4().hex[:8]}") as worker:
        result = await client.execute_workflow(Rollout.run, spec, id=spec.workflow_id(), task_queue=worker.task_queue)
    await registration.close()

    assert result.outcome == "completed" and result.counts == {"complete": 8}
    assert result.compartments["__default__"].completed_nodes == 8
    runs: dict[str, list[int]] = {}
    async for execution in client.list_workflows(f"WorkflowId STARTS_WITH '{spec.workflow_id()}'"):
        runs.setdefault(execution.id, []).append(execution.history_length)
    parent = runs[spec.workflow_id()]
    batches = [lengths for wid, lengths in runs.items() if "/batch-" in wid]
    assert len(parent) > 1, "the rollout continued as new"
    assert any(len(lengths) > 1 for lengths in batches), "a batch continued as new between chunks"
    # Every run of the parent and the batches stays near the suggestion: one more batch or chunk at most (a chunk
    # of these two nodes with pods to drain: about 60 events, each node's start in an activity of its own before
    # its drain, node-update-starts-with-stages). (A NodeUpdate's history is bounded by its steps.)
    assert max(max(parent), *(max(lengths) for lengths in batches)) < 5 * SUGGEST_AFTER
