"""The disruption budget entity through worker kills while its cluster reads outlast a workflow task.

A read slower than the workflow-task timeout makes the worker heartbeat the task and, when the worker dies
meanwhile, the next worker resumes from the history; a killed worker also leaves the entity's fired timers on
its sticky queue until they time out there. That is where the entity's decisions once depended on the worker's
clock instead of its history (a nondeterminism error that stopped it: docs/disruption-budget.md). Every run
this test makes must replay with the current code (none failing a task for nondeterminism), and the budget must hold
(from the emulator's audit).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import timedelta

import pytest

from tests.worker_process import spawn_worker, stop_worker, wait_polling, worker_env
from tests.workflows.budget.test_disruption_budget import max_out_of_service, small_fleet
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.budget.budget import Budget
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.models import DisruptionBudgetInput
from workflows.maintenance.node_maintenance import NodeMaintenance, NodeMaintenanceInput

SLOW_READ = 11.0  # seconds: longer than the 10 s workflow-task timeout
KILLS = 3


@pytest.mark.usefixtures("replay_histories")
async def test_entity_survives_worker_kills_while_its_cluster_reads_are_slow(
    client, temporal_address, k8s, kubeconfig_path, tmp_path
):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    await k8s.seed(small_fleet())
    await k8s.add_fault({"verb": "list", "resource": "nodes"}, {"delay": SLOW_READ}, count=3, skip=1)

    task_queue = f"budget-kills-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, temporal_address, kubeconfig_path, MILLWRIGHT_TASK_QUEUE=task_queue)
    log = tmp_path / "worker.log"
    worker = spawn_worker(env, log)
    try:
        await wait_polling(client, task_queue, worker, log)
        inp = DisruptionBudgetInput(cluster="lab", budget=Budget(count=2), check_interval=timedelta(seconds=0.5),
                                    liveness_interval=timedelta(seconds=1), task_queue=task_queue)  # fmt: skip
        entity = await client.start_workflow(DisruptionBudget.run, inp, id=inp.workflow_id(), task_queue=task_queue)
        holders = []
        for i in range(1, 6):
            m = NodeMaintenanceInput(cluster="lab", node=f"node-{i:02d}", reason="worker kill test",
                                     uncordon_after=True, drain={"eviction_retry_interval": 0.5, "timeout": 120})  # fmt: skip
            holders.append(await client.start_workflow(NodeMaintenance.run, m, id=f"{m.workflow_id()}/{uuid.uuid4().hex[:6]}",
                                                       task_queue=task_queue))  # fmt: skip
        for kill in range(KILLS):
            await asyncio.sleep(rng.uniform(2, 9))
            worker.kill()  # SIGKILL, mid-read or mid-task
            worker.wait(10)
            # Once down past the sticky queue's 10 s: the entity's timers fire meanwhile, and a fresh worker
            # takes its next task from the history.
            await asyncio.sleep(12 if kill == KILLS - 1 else rng.uniform(0, 4))
            worker = spawn_worker(env, log)
            await wait_polling(client, task_queue, worker, log)
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in holders)), 300)
        await record_history(entity, "disruption_budget_worker_kills")
    finally:
        stop_worker(worker)

    assert all(r.outcome == "completed" and r.uncordoned for r in results), (seed, results)
    assert max_out_of_service(await k8s.audit()) <= 2, seed
    # Every run it made replays with today's code, and none failed a task for nondeterminism (replay_histories).
