"""Helpers for workflow tests against the Kubernetes emulator."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from kubernetes.aio.client import CoreV1Api, V1Node, V1Pod

from lab.fleet import Fleet
from lab.k8s.process import EmulatorProcess
from lab.k8s.store import UNCHANGED_CHECK_ENV

T = TypeVar("T")


@contextlib.contextmanager
def checked_emulator(folder: Path, **options: Any) -> Iterator[EmulatorProcess]:
    """The Kubernetes emulator as a subprocess that checks every stored object stays as it was stored (its watch
    history holds them, not copies: lab/k8s/store.py); at its end, none may have been changed in place."""
    log = folder / "changed-in-place.log"
    with EmulatorProcess(env={UNCHANGED_CHECK_ENV: str(log)}, **options) as emulator:
        yield emulator
    assert not log.exists(), f"the emulator changed stored objects in place:\n{log.read_text()[:4000]}"


def fleet_objects(
    *,
    trainer_min_available: int = 7,
    bare_pod_on: str | None = None,
    protected_on: str | None = None,
    protected_finish_after: int | None = None,
) -> list[dict[str, Any]]:
    """Five 8-GPU nodes: 8 four-GPU trainer pods fill node-01..04 behind a PDB, node-05 has
    room for the replacements; a DaemonSet on every node."""
    workloads: list[dict[str, Any]] = [
        {
            "name": "trainer",
            "namespace": "training",
            "replicas": 8,
            "labels": {"app": "trainer"},
            "gpus": 4,
            "nodes": ["node-01", "node-02", "node-03", "node-04"],
            "pdb": {"minAvailable": trainer_min_available},
        },
        {"name": "dcgm-exporter", "kind": "DaemonSet", "namespace": "gpu-operator", "labels": {"app": "dcgm"}},
    ]
    if bare_pod_on:
        workloads.append({"name": "scratch", "kind": "Pod", "namespace": "default", "node": bare_pod_on})
    if protected_on:
        workloads.append(
            single_pod_workload("protected", protected_on, {"millwright.dev/protected": "true"}, protected_finish_after)
        )
    fleet = Fleet.model_validate(
        {"cluster": "lab", "nodes": [{"prefix": "node-", "count": 5, "gpus": 8}], "workloads": workloads}
    )
    return fleet.to_objects()


def single_pod_workload(name: str, node: str, labels: dict[str, str], finish_after: int | None) -> dict[str, Any]:
    """One pod in namespace `training` on `node`, finishing `finish_after` seconds after it runs (never if None)."""
    annotations = {}
    if finish_after is not None:
        annotations["lab.millwright.dev/finish-after-seconds"] = str(finish_after)
    return {
        "name": name,
        "namespace": "training",
        "replicas": 1,
        "labels": labels,
        "nodes": [node],
        "annotations": annotations,
    }


async def pods_on(core: CoreV1Api, node: str) -> list[V1Pod]:
    return (await core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")).items


async def read_node(core: CoreV1Api, node: str) -> V1Node:
    return await core.read_node(node)


async def wait_for(
    probe: Callable[[], Awaitable[T | None]], *, what: str, timeout: float = 30.0, interval: float = 0.2
) -> T:
    """Poll until `probe` returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        found = await probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def declare_lab_budget(client, task_queue: str, budget: dict | None = None, cluster: str = "lab") -> None:
    """The cluster's disruption budget, declared as the lab's operator would before a test's rollouts (a requester's
    own budget never sets it; 10% of a small fleet is one node): by default every node, so that each run is held by
    its own budget. An entity already running (a test's own, with its budget) is left as it is."""
    from temporalio.common import WorkflowIDConflictPolicy

    from workflows.budget.budget import Budget
    from workflows.budget.disruption_budget import DisruptionBudget
    from workflows.budget.models import DisruptionBudgetInput

    declared = Budget.model_validate(budget or {"percent": 100})
    inp = DisruptionBudgetInput(cluster=cluster, budget=declared, task_queue=task_queue)
    await client.start_workflow(DisruptionBudget.run, inp, id=inp.workflow_id(), task_queue=task_queue,
                                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)  # fmt: skip
