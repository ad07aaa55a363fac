"""The partitioning tests' lab: 8-GPU H100 nodes with GPU training pods behind a PodDisruptionBudget and CPU-only web
pods, and what the audit shows of them."""

from __future__ import annotations

from typing import Any

from lab.fleet import Fleet

H100 = "NVIDIA-H100-80GB-HBM3"


def mig_fleet(count: int = 4, *, trainer_min_available: int | None = None) -> list[dict[str, Any]]:
    """Nodes gpu-01.. (label `mig=true`), each with one 8-GPU trainer pod (a ReplicaSet behind a PDB when
    `trainer_min_available` is set) and one CPU-only web pod; a DaemonSet on every node."""
    names = [f"gpu-{i:02d}" for i in range(1, count + 1)]
    trainer: dict[str, Any] = {"name": "trainer", "namespace": "training", "replicas": count, "gpus": 8,
                               "labels": {"app": "trainer"}, "nodes": names}  # fmt: skip
    if trainer_min_available is not None:
        trainer["pdb"] = {"minAvailable": trainer_min_available}
    workloads = [
        trainer,
        {"name": "web", "namespace": "apps", "replicas": count, "labels": {"app": "web"}, "nodes": names},
        {"name": "dcgm-exporter", "kind": "DaemonSet", "namespace": "gpu-operator", "labels": {"app": "dcgm"}},
    ]
    nodes = [{"prefix": "gpu-", "count": count, "labels": {"mig": "true", "nvidia.com/gpu.product": H100}}]
    return Fleet.model_validate({"cluster": "lab", "nodes": nodes, "workloads": workloads}).to_objects()
