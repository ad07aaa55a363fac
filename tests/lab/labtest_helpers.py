"""Object builders and polling helpers for the lab emulator tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def node(name: str, *, ready: bool = True, unschedulable: bool = False, gpus: int = 8, labels=None) -> dict:
    n = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "capacity": {"nvidia.com/gpu": str(gpus), "cpu": "8"},
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "8"},
            "nodeInfo": {"bootID": f"boot-{name}"},
        },
    }
    return n


def running_pod(
    name: str,
    ns: str = "default",
    node_name: str = "n1",
    labels=None,
    owner=None,
    ready: bool = True,
    grace: int = 30,
    annotations=None,
) -> dict:
    md: dict = {"name": name, "namespace": ns, "labels": labels or {}}
    if owner:
        md["ownerReferences"] = [owner]
    if annotations:
        md["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {
            "nodeName": node_name,
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "c", "image": "busybox"}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pdb(name: str, ns: str = "default", labels=None, **spec) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": labels or {"app": name}}, **spec},
    }
