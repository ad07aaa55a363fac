"""Fleets, specs and audit-log reconstruction for rollout tests."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from activities.kube.models import JOB_INTERRUPT_LABEL, JOB_NAMESPACE
from lab.fleet import Fleet
from tests.kube_helpers import single_pod_workload
from workflows.rollout.models import BatchResult, NodeUpdateResult, NodeUpdateStatus
from workflows.rollout.rollout import RolloutBatch
from workflows.rollout.spec.spec import RolloutInput

JOBS_FAST = {"defaultSeconds": 0.1, "rules": []}
REBOOT_SECONDS = 0.3


def rollout_fleet(
    pools: dict[str, int],
    *,
    protected_on: str | None = None,
    protected_finish_after: int | None = None,
    web_pdb_min_available: int | None = None,
) -> list[dict[str, Any]]:
    """Nodes `<pool>-01..` labelled `pool=<pool>`, a small web pod on each node (a ReplicaSet
    the drains evict), a DaemonSet; optionally a non-interruptible job pod on one node."""
    nodes = [
        {"prefix": f"{pool}-", "count": count, "labels": {"pool": pool, "gpu": "true"}} for pool, count in pools.items()
    ]
    names = [f"{pool}-{i:02d}" for pool, count in pools.items() for i in range(1, count + 1)]
    web: dict[str, Any] = {
        "name": "web",
        "namespace": "apps",
        "replicas": len(names),
        "labels": {"app": "web"},
        "nodes": names,
        "terminationGracePeriodSeconds": 5,
    }
    if web_pdb_min_available is not None:
        web["pdb"] = {"minAvailable": web_pdb_min_available}
    workloads: list[dict[str, Any]] = [
        web,
        {"name": "dcgm-exporter", "kind": "DaemonSet", "namespace": "gpu-operator", "labels": {"app": "dcgm"}},
    ]
    if protected_on:
        workloads.append(
            single_pod_workload("long-training", protected_on, {"workload": "training"}, protected_finish_after)
        )
    return Fleet.model_validate({"cluster": "lab", "nodes": nodes, "workloads": workloads}).to_objects()


def rollout_spec(name: str, *, policy: dict[str, Any] | None = None, **fields: Any) -> RolloutInput:
    spec: dict[str, Any] = {
        "cluster": "lab",
        "name": name,
        "nodeSelectors": {"matchLabels": {"gpu": "true"}},
        "packages": {
            "kernel-tuning": {
                "version": "1.2.0",
                "image": "registry.local/millwright/kernel-tuning",
                "interrupt": {"type": "reboot"},
            }
        },
        "drainConfig": {"timeout": "2m"},
        "deploymentPolicy": policy or {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}},
        "stageRetries": 0,
    }
    spec.update(fields)
    return RolloutInput.model_validate(spec)


def availability_timeline(audit: list[dict]) -> list[tuple[int, dict[str, bool]]]:
    """After every node write the API server saw, which nodes were out of service
    (cordoned by anyone or not Ready): [(seq, {node: unavailable})]."""
    state: dict[str, bool] = {}
    timeline = []
    for entry in audit:
        after = entry.get("nodeAfter")
        if entry.get("resource") != "nodes" or not after:
            continue
        state[entry["name"]] = after["unschedulable"] or not after["ready"]
        timeline.append((entry["seq"], dict(state)))
    return timeline


def max_unavailable(audit: list[dict], members: set[str]) -> int:
    return max(
        (sum(1 for n, down in s.items() if down and n in members) for _, s in availability_timeline(audit)), default=0
    )


def nodes_down_with_workload(audit: list[dict]) -> list[str]:
    """Every moment the API server saw a node go down (a reboot stage Job created for it, or the node
    NotReady) while a pod a drain should have evicted was still on it, terminating or not: any pod but a
    DaemonSet's and the stage Jobs' own. Empty: no reboot ever hit a workload. '<seq> <node> <what>: <pods>'."""
    found = []
    for entry in audit:
        node_after, job_after = entry.get("nodeAfter"), entry.get("jobAfter")
        if node_after is not None and not node_after["ready"]:
            node, what, pods = entry["name"], "NotReady", node_after["pods"]
        elif job_after is not None and job_after["labels"].get(JOB_INTERRUPT_LABEL) == "reboot":
            node, what, pods = job_after["node"], f"reboot Job {entry['name']} created", job_after["podsOnNode"]
        else:
            continue
        workload = [
            p["pod"] for p in pods if p["controller"] != "DaemonSet" and not p["pod"].startswith(f"{JOB_NAMESPACE}/")
        ]
        if workload:
            found.append(f"{entry['seq']} {node} {what}: {', '.join(workload)}")
    return found


def rebooted(audit: list[dict]) -> set[str]:
    """Nodes the API server saw go NotReady."""
    return {e["name"] for e in audit if (e.get("nodeAfter") or {}).get("ready") is False}


def accepted_evictions(audit: list[dict]) -> dict[str, int]:
    """Pod (namespace/name) -> how many of its evictions the API server accepted (2xx)."""
    out: dict[str, int] = {}
    for e in audit:
        if e.get("subresource") == "eviction" and 200 <= (e.get("code") or 0) < 300:
            key = f"{e['namespace']}/{e['name']}"
            out[key] = out.get(key, 0) + 1
    return out


def _batches(rollout_id: str, running: bool = False) -> str:
    query = f"WorkflowType = 'RolloutBatch' AND WorkflowId STARTS_WITH '{rollout_id}/'"
    return query + (" AND ExecutionStatus = 'Running'" if running else "")


async def node_status(client: Client, rollout_id: str, node: str) -> NodeUpdateStatus | None:
    """The node's status as its batch shows it while the batch updates it (None: no batch runs it now)."""
    async for batch in client.list_workflows(_batches(rollout_id, running=True)):
        try:
            nodes = await client.get_workflow_handle(batch.id).query(RolloutBatch.nodes)
        except RPCError:  # the batch closed meanwhile
            continue
        if node in nodes:
            return nodes[node]
    return None


async def node_result(client: Client, rollout_id: str, node: str) -> NodeUpdateResult:
    """The node's update result, from the batch that updated it."""
    async for batch in client.list_workflows(_batches(rollout_id)):
        outputs = (await client.get_workflow_handle(batch.id, result_type=BatchResult).result()).raw()
        if node in outputs:
            return NodeUpdateResult.model_validate(outputs[node])
    raise AssertionError(f"no batch of {rollout_id} updated {node}")


async def batch_handle(client: Client, rollout_id: str, node: str) -> WorkflowHandle:
    """The run of the batch that updated the node (for its history)."""
    async for batch in client.list_workflows(_batches(rollout_id)):
        handle = client.get_workflow_handle(batch.id, run_id=batch.run_id, result_type=BatchResult)
        if batch.status == WorkflowExecutionStatus.COMPLETED and node in (await handle.result()).raw():
            return handle
    raise AssertionError(f"no batch of {rollout_id} updated {node}")
