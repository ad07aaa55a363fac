"""A worker SIGKILLed mid-drain, API faults and a PDB block: the drain still finishes, safely.

Everything asserted here is read from the emulator's audit log, not from the
workflow's own account of what it did.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest
from kubernetes.aio.client import PolicyV1Api

from activities.kube.connector import USER_AGENT
from activities.kube.models import CORDONED_BY
from tests.kube_helpers import fleet_objects, pods_on, read_node, wait_for
from tests.worker_process import spawn_worker, stop_worker, wait_polling, worker_env
from workflows.maintenance.node_maintenance import NodeMaintenance, NodeMaintenanceInput

EVICTIONS = {"verb": "create", "resource": "pods", "subresource": "eviction"}
FAULTS = [
    # The cordon's conditional patch conflicts once: re-read and retried.
    ({"verb": "patch", "resource": "nodes"}, {"status": 409}, 1),
    # The API server is briefly unavailable for evictions.
    (EVICTIONS, {"status": 503}, 2),
    # Reads drop their connection and one list is slow.
    ({"verb": "get", "resource": "pods"}, {"drop": "before"}, 2),
    ({"verb": "list", "resource": "pods"}, {"delay": 1.5}, 1),
]

# A worker killed or an API failing under the workflows: replay what they wrote (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("replay_histories")


async def test_worker_killed_mid_drain_finishes_without_violating_the_budget(
    client, temporal_address, k8s, core, kubeconfig_path, tmp_path
):
    # The budget blocks every eviction until the test relaxes it; then replacements take a
    # while to become Ready, and evicted pods 6 s to terminate, so a retried eviction finds
    # its pod still there.
    await k8s.seed(fleet_objects(trainer_min_available=8))
    await k8s.configure(podStartSeconds=3.0, graceScale=0.2)
    for match, action, count in FAULTS:
        await k8s.add_fault(match, action, count)
    trainers = {p.metadata.name for p in await pods_on(core, "node-01") if p.metadata.labels.get("app") == "trainer"}
    assert len(trainers) == 2

    task_queue = f"crash-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path, temporal_address, kubeconfig_path, MILLWRIGHT_TASK_QUEUE=task_queue)
    log = tmp_path / "worker.log"
    worker = spawn_worker(env, log)
    try:
        await wait_polling(client, task_queue, worker, log)
        inp = NodeMaintenanceInput(
            cluster="lab", node="node-01", reason="kernel update", drain={"eviction_retry_interval": 0.5}
        )
        handle = await client.start_workflow(
            NodeMaintenance.run, inp, id=f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}", task_queue=task_queue
        )

        async def evictions(outcome: str):
            return [
                e
                for e in await k8s.audit()
                if _eviction_request(e) and (e.get("eviction") or {}).get("outcome") == outcome
            ]

        # Killed while the budget blocks the drain: the wait state must survive the worker.
        await wait_for(lambda: evictions("blocked"), what="an eviction blocked by the budget", timeout=60)
        worker.kill()  # SIGKILL: no graceful anything
        worker.wait(10)
        worker = spawn_worker(env, log)
        # The first eviction the budget allows is carried out but its answer is lost: the
        # retry must not evict again.
        await k8s.add_fault(EVICTIONS, {"drop": "after"}, 1)
        await PolicyV1Api(core.api_client).patch_namespaced_pod_disruption_budget(
            "trainer", "training", {"spec": {"minAvailable": 7}}
        )

        # Killed again right after the first eviction the budget allowed.
        await wait_for(lambda: evictions("evicted"), what="the first accepted eviction", timeout=90)
        worker.kill()
        worker.wait(10)
        worker = spawn_worker(env, log)

        result = await asyncio.wait_for(handle.result(), timeout=150)
    finally:
        stop_worker(worker)

    assert result.outcome == "completed"
    assert sorted(result.evicted) == sorted(f"training/{name}" for name in trainers)
    node = await read_node(core, "node-01")
    assert node.spec.unschedulable and node.metadata.annotations[CORDONED_BY] == handle.id
    assert not {p.metadata.name for p in await pods_on(core, "node-01")} & trainers

    audit = await k8s.audit()
    assert all(f["remaining"] == 0 for f in await k8s.faults()), "every injected fault fired"

    # No pod was evicted twice, even the one whose answer was dropped: every eviction the
    # server carried out (201, answered or not) is counted, whatever path it took.
    carried_out = Counter(e["name"] for e in audit if _eviction_request(e) and e["code"] == 201)
    assert set(carried_out) == trainers and max(carried_out.values()) == 1, carried_out

    # The budget held at every accepted eviction, judged from the live pods at that moment.
    for entry in audit:
        if _accepted_eviction(entry):
            eviction = entry["eviction"]
            assert eviction["currentHealthyBefore"] > eviction["desiredHealthy"], entry

    # The budget did block, and blocked evictions were retried rather than failing the run.
    assert any((e.get("eviction") or {}).get("outcome") == "blocked" for e in audit if _eviction_request(e))

    # One cordon, applied once (status writes are the drain's DrainBlocked condition, not cordons).
    cordons = [
        e for e in audit
        if e["resource"] == "nodes" and e["verb"] == "patch" and e["code"] == 200 and _ours(e)
        and not e.get("subresource")
    ]  # fmt: skip
    assert len(cordons) == 1, cordons


def _ours(entry: dict) -> bool:
    return entry.get("userAgent", "").startswith(USER_AGENT)


def _eviction_request(entry: dict) -> bool:
    return entry.get("subresource") == "eviction" and _ours(entry)


def _accepted_eviction(entry: dict) -> bool:
    return _eviction_request(entry) and (entry.get("eviction") or {}).get("outcome") == "evicted"
