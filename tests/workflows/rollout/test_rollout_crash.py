"""A 50-node rollout whose worker is SIGKILLed several times at random moments.

It must finish with the same final state as an undisturbed run of the same spec, with
no stage applied twice on any node and the budget held throughout, all judged from
what the Kubernetes emulator saw.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import Counter

import pytest
from temporalio.client import WorkflowExecutionStatus

from activities.kube.connector import USER_AGENT
from activities.kube.models import PACKAGES_ANNOTATION, ROLLOUT_STATE_LABEL
from tests.kube_helpers import declare_lab_budget, wait_for
from tests.worker_process import spawn_worker, stop_worker, wait_polling, worker_env
from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS, max_unavailable, rollout_fleet, rollout_spec
from workflows.rollout.models import RolloutResult
from workflows.rollout.rollout import Rollout

NODES = 50
POLICY = {"default": {"budget": {"count": 10}, "strategy": {"fixed": {"initialBatch": 10}}}}

# A worker killed or an API failing under the workflows: replay what they wrote (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("replay_histories")


async def final_state(core) -> dict[str, tuple]:
    nodes = (await core.list_node()).items
    return {
        n.metadata.name: (
            bool(n.spec.unschedulable),
            (n.metadata.labels or {}).get(ROLLOUT_STATE_LABEL),
            json.loads((n.metadata.annotations or {}).get(PACKAGES_ANNOTATION, "{}")),
        )
        for n in nodes
    }


async def run_rollout(client, k8s, env, log, name: str, kills: int, rng: random.Random):
    await k8s.reset()
    await k8s.seed(rollout_fleet({"a": NODES}))
    await k8s.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS, podStartSeconds=0.1, graceScale=0.02)
    worker = spawn_worker(env, log)
    try:
        await wait_polling(client, env["MILLWRIGHT_TASK_QUEUE"], worker, log)
        spec = rollout_spec(name, policy=POLICY)
        await declare_lab_budget(client, env["MILLWRIGHT_TASK_QUEUE"])
        handle = await client.start_workflow(
            Rollout.run,
            spec,
            id=f"{spec.workflow_id()}-{uuid.uuid4().hex[:6]}",
            task_queue=env["MILLWRIGHT_TASK_QUEUE"],
        )
        killed_mid_run = 0
        for started in range(1, kills + 1):
            # Each worker gets going before it is killed, however slow the machine is.
            await wait_for(lambda: _workers_polling(log, started), what="the worker polling", timeout=60)
            await asyncio.sleep(rng.uniform(1.5, 4.0))
            if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                killed_mid_run += 1
            worker.kill()  # SIGKILL, mid-whatever
            worker.wait(10)
            worker = spawn_worker(env, log)
        result: RolloutResult = await asyncio.wait_for(handle.result(), timeout=240)
    finally:
        stop_worker(worker)
    return result, killed_mid_run


async def _workers_polling(log, count: int) -> bool:
    """Whether `count` workers have written to the shared log that they poll."""
    return log.exists() and log.read_text().count("polling task queue") >= count


async def test_rollout_survives_repeated_worker_kills(client, temporal_address, k8s, core, kubeconfig_path, tmp_path):
    env = worker_env(
        tmp_path, temporal_address, kubeconfig_path, MILLWRIGHT_TASK_QUEUE=f"rollout-crash-{uuid.uuid4().hex[:8]}"
    )
    log = tmp_path / "worker.log"
    rng = random.Random(20261129)

    undisturbed, _ = await run_rollout(client, k8s, env, log, "calm", kills=0, rng=rng)
    expected = await final_state(core)
    assert undisturbed.counts == {"complete": NODES}

    log.unlink()
    disturbed, killed_mid_run = await run_rollout(client, k8s, env, log, "chaos", kills=3, rng=rng)
    assert killed_mid_run >= 2, "the kills must land while the rollout runs"
    assert disturbed.counts == undisturbed.counts
    assert await final_state(core) == expected

    audit = await k8s.audit()
    # No stage ran twice on any node: one Job per (node, package, stage).
    jobs = [o for o in await k8s.dump() if o["kind"] == "Job"]
    runs = Counter(
        (j["metadata"]["labels"]["millwright.dev/node"], j["metadata"]["labels"]["millwright.dev/package"],
         j["metadata"]["labels"]["millwright.dev/stage"])
        for j in jobs
    )  # fmt: skip
    assert len(runs) == NODES * 4 and max(runs.values()) == 1, [k for k, v in runs.items() if v > 1]
    creates = [e for e in audit if e["resource"] == "jobs" and e["verb"] == "create" and e["code"] == 201]
    assert len(creates) == NODES * 4 and all(e["userAgent"].startswith(USER_AGENT) for e in creates)
    # The budget held all along, across the kills.
    assert max_unavailable(audit, {f"a-{i:02d}" for i in range(1, NODES + 1)}) <= 10
