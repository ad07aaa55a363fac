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
from tests.workflows.budget.test_budget_units import DOMAIN_A, DOMAIN_B, DOMAIN_C, most_units_out, topology_fleet
from tests.workflows.budget.test_disruption_budget import max_out_of_service, small_fleet
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.budget.budget import Budget
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.models import BudgetChange, DisruptionBudgetInput
from workflows.maintenance.node_maintenance import NodeMaintenance, NodeMaintenanceInput

SLOW_READ = 11.0  # seconds: longer than the 10 s workflow-task timeout
KILLS = 3


async def kill_workers(client, task_queue: str, env: dict, log, worker, rng: random.Random):
    """Kill the worker KILLS times at random moments and start another; the last one is running."""
    for kill in range(KILLS):
        await asyncio.sleep(rng.uniform(2, 9))
        worker.kill()  # SIGKILL, mid-read or mid-task
        worker.wait(10)
        # Once down past the sticky queue's 10 s: the entity's timers fire meanwhile, and a fresh worker
        # takes its next task from the history.
        await asyncio.sleep(12 if kill == KILLS - 1 else rng.uniform(0, 4))
        worker = spawn_worker(env, log)
        await wait_polling(client, task_queue, worker, log)
    return worker


async def maintain_under_kills(client, temporal_address, kubeconfig_path, tmp_path, rng: random.Random,
                               nodes: list[str], budget: int, drain: dict, change: BudgetChange | None = None,
                               history: str | None = None) -> list:  # fmt: skip
    """A NodeMaintenance of each node under the budget entity (`change` set on it first), while workers are killed;
    the maintenances' results (`history`: the entity's history is recorded under that name)."""
    task_queue = f"budget-kills-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, temporal_address, kubeconfig_path, MILLWRIGHT_TASK_QUEUE=task_queue)
    log = tmp_path / "worker.log"
    worker = spawn_worker(env, log)
    try:
        await wait_polling(client, task_queue, worker, log)
        inp = DisruptionBudgetInput(cluster="lab", budget=Budget(count=budget), check_interval=timedelta(seconds=0.5),
                                    liveness_interval=timedelta(seconds=1), task_queue=task_queue)  # fmt: skip
        entity = await client.start_workflow(DisruptionBudget.run, inp, id=inp.workflow_id(), task_queue=task_queue)
        if change is not None:
            await entity.execute_update(DisruptionBudget.set_budget, change)
        holders = []
        for node in nodes:
            m = NodeMaintenanceInput(cluster="lab", node=node, reason="worker kill test", uncordon_after=True,
                                     drain=drain)  # fmt: skip
            holders.append(await client.start_workflow(NodeMaintenance.run, m, id=f"{m.workflow_id()}/{uuid.uuid4().hex[:6]}",
                                                       task_queue=task_queue))  # fmt: skip
        worker = await kill_workers(client, task_queue, env, log, worker, rng)
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in holders)), 300)
        if history is not None:
            await record_history(entity, history)
    finally:
        stop_worker(worker)
    return list(results)


@pytest.mark.usefixtures("replay_histories")
async def test_entity_survives_worker_kills_while_its_cluster_reads_are_slow(
    client, temporal_address, k8s, kubeconfig_path, tmp_path
):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    await k8s.seed(small_fleet())
    await k8s.add_fault({"verb": "list", "resource": "nodes"}, {"delay": SLOW_READ}, count=3, skip=1)
    results = await maintain_under_kills(client, temporal_address, kubeconfig_path, tmp_path, rng,
                                         [f"node-{i:02d}" for i in range(1, 6)], 2,
                                         {"eviction_retry_interval": 0.5, "timeout": 120},
                                         history="disruption_budget_worker_kills")  # fmt: skip

    assert all(r.outcome == "completed" and r.uncordoned for r in results), (seed, results)
    assert max_out_of_service(await k8s.audit()) <= 2, seed
    # Every run it made replays with today's code, and none failed a task for nondeterminism (replay_histories).


# Three NVLink domains of two nodes; train-a spans domains A and B.
KILL_DOMAINS = {"node-01": DOMAIN_A, "node-02": DOMAIN_A, "node-03": DOMAIN_B, "node-04": DOMAIN_B,
                "node-05": DOMAIN_C, "node-06": DOMAIN_C}  # fmt: skip
KILL_GANGS = {"train-a": ["node-01", "node-03"], "train-b": ["node-02"], "train-c": ["node-05"],
              "train-d": ["node-06"]}  # fmt: skip


@pytest.mark.usefixtures("replay_histories")
async def test_domain_and_gang_limits_hold_through_worker_kills(
    client, temporal_address, k8s, kubeconfig_path, tmp_path
):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    await k8s.seed(topology_fleet(KILL_DOMAINS, KILL_GANGS))
    await k8s.add_fault({"verb": "list", "resource": "nodes"}, {"delay": SLOW_READ}, count=3, skip=1)
    change = BudgetChange(budget=Budget(count=3), nvlink_domains=1, gangs=2, by="test", reason="one domain, two gangs")
    results = await maintain_under_kills(client, temporal_address, kubeconfig_path, tmp_path, rng, list(KILL_DOMAINS),
                                         3, {"eviction_retry_interval": 0.5, "timeout": 120, "force": True},
                                         change)  # fmt: skip

    assert all(r.outcome == "completed" and r.uncordoned for r in results), (seed, results)
    audit = await k8s.audit()
    # Judged from the cordons the API server saw, by where the seed placed each node and gang.
    domains, gangs = most_units_out(audit, KILL_DOMAINS, KILL_GANGS)
    assert domains == 1 and gangs <= 2, (seed, domains, gangs)
    assert max_out_of_service(audit) <= 3, seed
