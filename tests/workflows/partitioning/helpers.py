"""The partitioning tests' lab: 8-GPU H100 nodes gpu-01.. (label `mig=true`), each running one 4-GPU trainer pod
(a ReplicaSet behind a PodDisruptionBudget that allows one trainer down at a time) and one CPU-only web pod, and
two spare whole-GPU nodes the evicted trainers move to; what the audit shows of them."""

from __future__ import annotations

from typing import Any

from lab.fleet import Fleet

H100 = "NVIDIA-H100-80GB-HBM3"
MIG_PENDING_SECONDS = 0.2


def mig_fleet(count: int = 4) -> list[dict[str, Any]]:
    names = [f"gpu-{i:02d}" for i in range(1, count + 1)]
    gpu_labels = {"nvidia.com/gpu.product": H100}
    workloads = [
        {"name": "trainer", "namespace": "training", "replicas": count, "gpus": 4, "labels": {"app": "trainer"},
         "nodes": names, "pdb": {"minAvailable": count - 1}, "terminationGracePeriodSeconds": 5},
        {"name": "web", "namespace": "apps", "replicas": count, "labels": {"app": "web"}, "nodes": names},
        {"name": "dcgm-exporter", "kind": "DaemonSet", "namespace": "gpu-operator", "labels": {"app": "dcgm"}},
    ]  # fmt: skip
    nodes = [{"prefix": "gpu-", "count": count, "labels": {"mig": "true", **gpu_labels}},
             {"prefix": "spare-", "count": 2, "labels": gpu_labels}]  # fmt: skip
    return Fleet.model_validate({"cluster": "lab", "nodes": nodes, "workloads": workloads}).to_objects()


async def mig_lab(k8s, count: int = 4) -> None:
    await k8s.seed(mig_fleet(count))
    await k8s.configure(migPendingSeconds=MIG_PENDING_SECONDS, migStrategy="mixed")


def evictions_past_their_budget(audit: list[dict]) -> list[str]:
    """Accepted evictions whose PodDisruptionBudget allowed none at that moment (the emulator's eviction record)."""
    return [f"{e['namespace']}/{e['name']}" for e in audit
            if e.get("subresource") == "eviction" and 200 <= (e.get("code") or 0) < 300
            and (e.get("eviction") or {}).get("pdb") and e["eviction"].get("outcome") == "evicted"
            and not e["eviction"].get("disruptionsAllowedBefore")]  # fmt: skip


def refused_evictions(audit: list[dict]) -> int:
    return sum(1 for e in audit if e.get("subresource") == "eviction" and e.get("code") == 429)
