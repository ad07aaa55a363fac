"""Seeding and inputs for the remediation tests."""

from __future__ import annotations

import os
from typing import Any

from lab.fleet import Fleet


def fleet(
    names: list[str],
    *,
    conditions: dict[str, list[dict]] | None = None,
    labels: dict[str, dict[str, str]] | None = None,
    not_ready: list[str] | None = None,
    cordoned: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """8-GPU nodes with these names, a trainer ReplicaSet behind a PDB on the first two, a DaemonSet on all;
    extra node conditions and labels by node name; nodes NotReady since the fleet's creation; nodes cordoned by
    someone (node -> holder)."""
    objects = Fleet.model_validate({
        "cluster": "lab",
        "nodes": [{"name": n, "gpus": 8, "ready": n not in (not_ready or [])} for n in names],
        "workloads": [
            {"name": "trainer", "namespace": "training", "replicas": 2, "gpus": 8, "labels": {"app": "trainer"},
             "nodes": names[:2], "pdb": {"maxUnavailable": 1}, "terminationGracePeriodSeconds": 5},
            {"name": "dcgm", "kind": "DaemonSet", "namespace": "gpu-operator", "labels": {"app": "dcgm"},
             "tolerations": [{"operator": "Exists"}]},
        ],
    }).to_objects()  # fmt: skip
    for obj in objects:
        if obj["kind"] != "Node":
            continue
        name = obj["metadata"]["name"]
        for c in (conditions or {}).get(name, []):
            obj["status"]["conditions"].append(
                {"lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z", **c}
            )
        obj["metadata"]["labels"].update((labels or {}).get(name, {}))
        if cordoned and name in cordoned:
            obj["spec"]["unschedulable"] = True
            obj["metadata"]["annotations"]["millwright.dev/cordoned-by"] = cordoned[name]
    return objects


def fast_settings(webhook_url: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Remediation settings that keep a test short."""
    settings: dict[str, Any] = {
        "drain": {"eviction_retry_interval": 0.5, "timeout": 60},
        "settle_timeout": 3, "settle_poll_interval": 0.5, "agent_timeout": 5, "reboot_timeout": 60,
        "burn_in_seconds": 1, "expected_gpus": 8, "gpu_model": "H200",
        "disruption_budget": os.environ.get("REM_NO_BUDGET") != "1",
    }  # fmt: skip
    if webhook_url:
        settings["webhook"] = {"url": webhook_url}
    settings.update(overrides)
    return settings


async def started_since(client, workflow_id: str, since) -> bool:
    """A run of `workflow_id` started at or after `since` (earlier tests' runs of the same ID aside)."""
    from temporalio.service import RPCError, RPCStatusCode

    try:
        described = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return described.start_time >= since


async def stop_remediation(client, cluster: str, node: str) -> None:
    """End `node`'s NodeRemediation and return its lease at once (the budget would recover it later; the next test
    needs it now)."""
    import contextlib

    from workflows.budget.disruption_budget import DisruptionBudget
    from workflows.budget.leases import LeaseRelease, budget_workflow_id
    from workflows.remediation.policy import remediation_workflow_id

    wf_id = remediation_workflow_id(cluster, node)
    with contextlib.suppress(Exception):  # not running
        await client.get_workflow_handle(wf_id).terminate("test over")
    with contextlib.suppress(Exception):
        await client.get_workflow_handle(budget_workflow_id(cluster)).execute_update(
            DisruptionBudget.release, LeaseRelease(node=node, holder=wf_id, reason="test over")
        )
