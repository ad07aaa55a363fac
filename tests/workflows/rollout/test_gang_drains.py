"""Gang-aware drains (workflows/maintenance/gang_drains.py) on a real dev server against the Kubernetes emulator: a
batch whose nodes share a gang cordons them all before it evicts any pod of the gang, then evicts the gang's pods
together; the rollout reports the gang once, with its GPU-hours at risk. Judged from the emulator's audit."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import pytest
from kubernetes.aio.client import AppsV1Api

from activities.kube.topology import KAI_POD_GROUP_ANNOTATION, Gang, gpu_hours_at_risk
from tests.kube_helpers import declare_lab_budget, read_node, wait_for
from tests.workflows.rollout.helpers import accepted_evictions, node_result, rollout_fleet, rollout_spec
from tests.workflows.rollout.test_rollout import lab_ready, start, status_where

pytestmark = pytest.mark.timeout(180)
NODES = ["a-01", "a-02", "a-03"]
WINDOW_SECONDS = 2.0  # the gang's evictions come together: the mates are cordoned already, nothing waits between


def trainer() -> dict:
    """A ReplicaSet of three 8-GPU pods of one KAI gang: each fills a node, so the scheduler puts one on each."""
    labels = {"app": "trainer"}
    container = {"name": "train", "image": "registry.local/train:1",
                 "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}}}  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "trainer", "namespace": "apps"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {KAI_POD_GROUP_ANNOTATION: "pg-trainer"}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 1},
            },
        },
    }


async def test_a_batch_cordons_a_gangs_nodes_before_it_evicts_the_gang_together(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 3}))
    await AppsV1Api(core.api_client).create_namespaced_replica_set("apps", trainer())

    async def running():
        pods = (await core.list_namespaced_pod("apps", label_selector="app=trainer")).items
        placed = [p for p in pods if p.status.phase == "Running" and p.status.start_time]
        return placed if len(placed) == 3 else None

    pods = await wait_for(running, what="the gang's three pods running")
    assert sorted(p.spec.node_name for p in pods) == NODES
    gang_pods = {f"apps/{p.metadata.name}" for p in pods}
    started = max(p.status.start_time for p in pods)
    since = await k8s.audit_cursor()
    before = datetime.fromtimestamp(time.time(), started.tzinfo)

    policy = {"default": {"budget": {"count": 3}, "strategy": {"fixed": {"initialBatch": 3}}}}
    # Two nodes in flight for three: the third starts only because a node waiting for its gang gives its place up.
    handle = await start(client, kube_worker, rollout_spec("gangs", policy=policy, maxInFlight=2))
    result = await handle.result()
    after = datetime.fromtimestamp(time.time(), started.tzinfo)
    assert result.counts == {"complete": 3}

    audit = await k8s.audit(since=since)
    cordoned = {}  # node -> the first write that left it cordoned
    for e in audit:
        if e.get("resource") == "nodes" and (e.get("nodeAfter") or {}).get("unschedulable"):
            cordoned.setdefault(e["name"], e["seq"])
    evictions = [e for e in audit if e.get("subresource") == "eviction" and 200 <= (e.get("code") or 0) < 300
                 and f"{e['namespace']}/{e['name']}" in gang_pods]  # fmt: skip
    assert sorted(cordoned) == NODES and len(evictions) == 3
    assert max(cordoned.values()) < min(e["seq"] for e in evictions), "a gang pod evicted before its nodes' cordons"
    times = [e["time"] for e in evictions]
    assert max(times) - min(times) < WINDOW_SECONDS, f"the gang's evictions spread over {max(times) - min(times):.1f}s"

    # Each node's drain evicted its pod of the gang: each reports it; the rollout counts it once.
    for node in NODES:
        res = await node_result(client, handle.id, node)
        assert list(res.interrupted_gangs) == ["kai:apps/pg-trainer"] and res.gangs_interrupted == 1
    assert (result.gangs_interrupted, list(result.interrupted_gangs)) == (1, ["kai:apps/pg-trainer"])
    gang = Gang(id="kai:apps/pg-trainer", gpus=24, started=started)
    low, high = gpu_hours_at_risk([gang], before), gpu_hours_at_risk([gang], after)
    assert low - 0.001 <= result.gpu_hours_at_risk <= high + 0.001


def gang_pod(node: str, labels: dict[str, str]) -> dict:
    """One pod of the gang pg-trainer, bound to `node`, owned by a training operator's job (the drain may evict it;
    nothing in the emulator recreates it)."""
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "trainer", "controller": True,
             "uid": "00000000-0000-4000-8000-00000000a11e"}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"trainer-{node}", "namespace": "apps", "labels": {"app": "trainer", **labels},
                     "annotations": {KAI_POD_GROUP_ANNOTATION: "pg-trainer"}, "ownerReferences": [owner]},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [
            {"name": "train", "image": "registry.local/train:1", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    }  # fmt: skip


async def test_a_gang_node_held_by_non_interruptible_pods_stays_in_service_and_holds_no_other(
        client, kube_worker, k8s, core):  # fmt: skip
    await lab_ready(k8s, rollout_fleet({"a": 3}))
    for node in NODES:  # a-02's pod of the gang must finish first (podNonInterruptLabels)
        await core.create_namespaced_pod("apps", gang_pod(node, {"workload": "training"} if node == "a-02" else {}))
    policy = {"default": {"budget": {"count": 3}, "strategy": {"fixed": {"initialBatch": 3}}}}
    spec = rollout_spec("gang-held", policy=policy, podNonInterruptLabels={"matchLabels": {"workload": "training"}},
                        nonInterruptRetryInterval="10m")  # fmt: skip
    handle = await start(client, kube_worker, spec)
    try:
        status = await status_where(handle, lambda s: s.counts == {"complete": 2, "blocked": 1}, "a-02 blocked")
        assert "non-interruptible" in status.problems["a-02"].reason
        assert not (await read_node(core, "a-02")).spec.unschedulable, "a blocked node is left in service"
        # The other nodes' pods of the gang went (their drains waited for no cordon a-02 never got); a-02's stayed.
        evicted = accepted_evictions(await k8s.audit())
        assert evicted.get("apps/trainer-a-01") == evicted.get("apps/trainer-a-03") == 1
        assert "apps/trainer-a-02" not in evicted
        assert (await core.read_namespaced_pod("trainer-a-02", "apps")).status.phase == "Running"
    finally:
        await handle.terminate("test over")


async def test_a_gang_node_waiting_for_the_cluster_budget_holds_no_other(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 3}))
    await declare_lab_budget(client, kube_worker.task_queue, {"count": 2})  # the third node waits for one back
    for node in NODES:
        await core.create_namespaced_pod("apps", gang_pod(node, {}))
    policy = {"default": {"budget": {"count": 3}, "strategy": {"fixed": {"initialBatch": 3}}}}
    handle = await start(client, kube_worker, rollout_spec("gang-budget", policy=policy))
    # No drain waits for a node the budget would grant only once it is over (that wait would never end).
    result = await asyncio.wait_for(handle.result(), timeout=90)
    assert result.counts == {"complete": 3}
    evicted = accepted_evictions(await k8s.audit())
    assert [evicted.get(f"apps/trainer-{n}") for n in NODES] == [1, 1, 1]
    # The first two nodes' drains broke the gang; the third found it restarting already: it counts once.
    assert (result.gangs_interrupted, list(result.interrupted_gangs)) == (1, ["kai:apps/pg-trainer"])
