"""GpuPartitioning paused mid-batch with its worker SIGKILLed, then resumed under a fresh worker that is killed
again: at every look each node is in service or cordoned with a reason, no node is relabelled while a GPU pod runs
on it, the budget holds, and the run ends with every node at its layout. Every run replays with today's code."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from activities.kube.models import CORDON_REASON
from tests.kube_helpers import read_node, wait_for
from tests.worker_process import spawn_worker, stop_worker, wait_polling, worker_env
from tests.workflows.partitioning.helpers import mig_lab
from tests.workflows.partitioning.test_gpu_partitioning import MEMBERS, partitioning
from tests.workflows.rollout.helpers import max_unavailable
from workflows.partitioning.gpu_partitioning import GpuPartitioning
from workflows.rollout.models import ReasonRequest

pytestmark = pytest.mark.usefixtures("replay_histories")


async def out_of_service_without_a_reason(core) -> list[str]:
    found = []
    for name in sorted(MEMBERS):
        node = await read_node(core, name)
        assert node.spec is not None and node.metadata is not None
        if node.spec.unschedulable and not (node.metadata.annotations or {}).get(CORDON_REASON):
            found.append(name)
    return found


async def test_pause_and_worker_kills_mid_batch_leave_every_node_accounted_for(
    client, temporal_address, k8s, core, kubeconfig_path, tmp_path
):
    await mig_lab(k8s)
    await k8s.configure(migPendingSeconds=1.5)  # nodes spend a while waiting for mig-manager: the kills land there
    queue = f"mig-kills-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, temporal_address, kubeconfig_path, MILLWRIGHT_TASK_QUEUE=queue)
    log = tmp_path / "worker.log"
    worker = spawn_worker(env, log)
    try:
        await wait_polling(client, queue, worker, log)
        inp = partitioning("kills")
        handle = await client.start_workflow(GpuPartitioning.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                             task_queue=queue)  # fmt: skip

        async def in_flight():
            status = await handle.query(GpuPartitioning.status)
            return status if status.counts.get("in_progress") else None

        await wait_for(in_flight, what="a batch in flight", timeout=90)
        await handle.execute_update(GpuPartitioning.pause, ReasonRequest(reason="hold for the kill"))
        worker.kill()  # SIGKILL mid-batch
        worker.wait(10)
        assert await out_of_service_without_a_reason(core) == []
        worker = spawn_worker(env, log)
        await wait_polling(client, queue, worker, log)
        await handle.execute_update(GpuPartitioning.resume, ReasonRequest(reason="go on"))
        await asyncio.sleep(1.0)
        worker.kill()
        worker.wait(10)
        assert await out_of_service_without_a_reason(core) == []
        worker = spawn_worker(env, log)
        result = await asyncio.wait_for(handle.result(), timeout=240)
    finally:
        stop_worker(worker)

    assert result.outcome == "completed" and result.counts == {"complete": 4}, result.problems
    changes = await k8s.mig_config_changes()
    assert sorted(c["node"] for c in changes) == sorted(MEMBERS) and all(c["gpuPods"] == [] for c in changes)
    assert max_unavailable(await k8s.audit(), MEMBERS) <= 2
    assert await out_of_service_without_a_reason(core) == []
    for name in sorted(MEMBERS):
        node = await read_node(core, name)
        assert not node.spec.unschedulable and node.status.capacity["nvidia.com/mig-1g.10gb"] == "56", name
