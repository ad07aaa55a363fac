"""NodeMaintenance on a real dev server against the Kubernetes emulator."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from kubernetes.aio.client import PolicyV1Api
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from activities.kube.models import CORDONED_BY
from starter.questions import current_details
from tests.kube_helpers import fleet_objects, pods_on, read_node, wait_for
from workflows.maintenance.node_maintenance import AbortRequest, NodeMaintenance, NodeMaintenanceInput, SkipWaitRequest

HISTORIES = Path(__file__).parents[2] / "histories"


def maintenance(node: str, **fields) -> NodeMaintenanceInput:
    fields.setdefault("drain", {"eviction_retry_interval": 0.5, "timeout": 60})
    return NodeMaintenanceInput(cluster="lab", node=node, reason="test maintenance", **fields)


async def start(client, worker, inp: NodeMaintenanceInput):
    # A unique suffix keeps runs of different tests apart on the shared dev server.
    return await client.start_workflow(
        NodeMaintenance.run, inp, id=f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}", task_queue=worker.task_queue
    )


async def record_history(handle, name: str) -> None:
    """Keep the run's history, with its workflow ID (children's IDs derive from it), for replay tests."""
    if os.environ.get("MILLWRIGHT_RECORD_HISTORIES") == "1":
        history = await handle.fetch_history()
        record = {"workflowId": history.workflow_id, "history": json.loads(history.to_json())}
        (HISTORIES / f"{name}.json").write_text(json.dumps(record, indent=1))


async def test_drain_waits_on_a_blocking_budget_then_completes(client, kube_worker, k8s, core):
    await k8s.seed(fleet_objects(trainer_min_available=8))
    before = await pods_on(core, "node-01")
    trainers = [p for p in before if p.metadata.labels.get("app") == "trainer"]
    assert trainers, "the fleet should place trainer pods on node-01"

    handle = await start(client, kube_worker, maintenance("node-01"))

    async def blocked():
        status = await handle.query(NodeMaintenance.status)
        return status if status.blocked else None

    status = await wait_for(blocked, what="an eviction blocked by the budget")
    blocked_eviction = next(iter(status.blocked.values()))
    assert blocked_eviction.budget == "training/trainer"
    assert "disruption budget" in blocked_eviction.message
    assert "training/trainer" in await current_details(handle)

    # Relax the budget: the drain proceeds on its own.
    policy = PolicyV1Api(core.api_client)
    await policy.patch_namespaced_pod_disruption_budget("trainer", "training", {"spec": {"minAvailable": 7}})
    result = await handle.result()

    assert result.outcome == "completed"
    assert sorted(result.evicted) == sorted(f"training/{p.metadata.name}" for p in trainers)
    assert any("DaemonSet" in s.reason for s in result.skipped)
    node = await read_node(core, "node-01")
    assert node.spec.unschedulable and node.metadata.annotations[CORDONED_BY] == handle.id
    remaining = await pods_on(core, "node-01")
    assert all(p.metadata.labels.get("app") != "trainer" for p in remaining)
    await record_history(handle, "node_maintenance_budget_wait")


async def test_uncordon_after_removes_only_our_cordon(client, kube_worker, k8s, core):
    await k8s.seed(fleet_objects())
    result = await (await start(client, kube_worker, maintenance("node-02", uncordon_after=True))).result()
    node = await read_node(core, "node-02")
    assert result.uncordoned and not node.spec.unschedulable
    assert CORDONED_BY not in (node.metadata.annotations or {})

    # Someone else's cordon stays, even when asked to uncordon after.
    await core.patch_node("node-03", {"spec": {"unschedulable": True}})
    result = await (await start(client, kube_worker, maintenance("node-03", uncordon_after=True))).result()
    node = await read_node(core, "node-03")
    assert not result.cordoned_by_us and not result.uncordoned
    assert node.spec.unschedulable
    assert "left in place" in result.note


async def test_unknown_node_fails_before_any_write(client, kube_worker, k8s):
    await k8s.seed(fleet_objects())
    since = await k8s.audit_cursor()
    handle = await start(client, kube_worker, maintenance("node-99"))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert "node 'node-99' not found" in str(failure.value.cause.cause)
    assert failure.value.cause.cause.type == "NodeNotFound"
    writes = [e for e in await k8s.audit(since=since, writes=True) if e["userAgent"].startswith("millwright")]
    assert writes == []


async def test_unmanaged_pod_blocks_the_drain_before_any_eviction(client, kube_worker, k8s):
    await k8s.seed(fleet_objects(bare_pod_on="node-04"))
    since = await k8s.audit_cursor()
    handle = await start(client, kube_worker, maintenance("node-04"))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    cause = failure.value.cause.cause
    assert cause.type == "DrainBlocked" and "no controller" in cause.message and "default/scratch" in cause.message
    evictions = [e for e in await k8s.audit(since=since) if e.get("subresource") == "eviction"]
    assert evictions == []
    status = await handle.query(NodeMaintenance.status)
    assert status.phase == "failed"


async def test_protected_pods_are_waited_for_and_skip_wait_ends_the_wait(client, kube_worker, k8s, core):
    await k8s.seed(fleet_objects(protected_on="node-01"))
    inp = maintenance(
        "node-01", protected_pod_selector="millwright.dev/protected=true", protected_pods_poll_interval=0.5
    )
    handle = await start(client, kube_worker, inp)
    status = await wait_for(
        lambda: _query_if(handle, lambda s: s.protected_pods), what="the wait for the protected pod"
    )
    assert status.phase == "waiting-for-protected-pods"
    # The job finishes while the workflow waits (not on a timer that may run out before the wait begins).
    (pod,) = [p for p in await pods_on(core, "node-01") if (p.metadata.labels or {}).get("millwright.dev/protected")]
    await core.patch_namespaced_pod_status(
        pod.metadata.name, pod.metadata.namespace, {"status": {"phase": "Succeeded"}}
    )
    result = await handle.result()
    assert result.outcome == "completed"
    assert any(e.startswith("training/protected") for e in result.evicted)

    # A protected pod that never finishes: the operator skips the wait.
    await k8s.seed(fleet_objects(protected_on="node-02"))
    handle = await start(
        client, kube_worker, maintenance("node-02", protected_pod_selector="millwright.dev/protected=true")
    )
    await wait_for(lambda: _query_if(handle, lambda s: s.protected_pods), what="the wait for the protected pod")
    await handle.execute_update(NodeMaintenance.skip_wait, SkipWaitRequest(reason="checkpoint saved by hand"))
    result = await handle.result()
    assert result.outcome == "completed"
    await record_history(handle, "node_maintenance_skip_wait")


async def test_abort_stops_evictions_and_removes_our_cordon(client, kube_worker, k8s, core):
    await k8s.seed(fleet_objects(trainer_min_available=8))
    handle = await start(client, kube_worker, maintenance("node-01"))
    await wait_for(lambda: _query_if(handle, lambda s: s.blocked), what="a blocked eviction")
    # Validators reject what makes no sense now, and nothing reaches the history.
    with pytest.raises(WorkflowUpdateFailedError) as rejected:
        await handle.execute_update(NodeMaintenance.skip_wait, SkipWaitRequest(reason="too late"))
    assert "no wait to skip" in str(rejected.value.cause)
    await handle.execute_update(NodeMaintenance.abort, AbortRequest(reason="change window closed"))
    with pytest.raises(WorkflowUpdateFailedError) as rejected:
        await handle.execute_update(NodeMaintenance.abort, AbortRequest(reason="twice"))
    assert "already aborting" in str(rejected.value.cause) or "nothing to abort" in str(rejected.value.cause)
    result = await handle.result()
    assert result.outcome == "aborted" and result.uncordoned
    node = await read_node(core, "node-01")
    assert not node.spec.unschedulable
    await record_history(handle, "node_maintenance_abort")


def test_bad_input_names_the_field():
    with pytest.raises(ValidationError) as err:
        NodeMaintenanceInput.model_validate(
            {
                "cluster": "lab",
                "node": "node-01",
                "reason": "x",
                "protected_pod_selector": "app in (a,",
                "drain": {"timeout": -1, "grace_period_seconds": -3},
            }
        )
    text = str(err.value)
    for field in ("protected_pod_selector", "drain.timeout", "drain.grace_period_seconds"):
        assert field in text
    with pytest.raises(ValidationError, match=r"unexpected|extra"):
        NodeMaintenanceInput.model_validate({"cluster": "lab", "node": "n", "reason": "x", "uncordon": True})


async def _query_if(handle, predicate):
    status = await handle.query(NodeMaintenance.status)
    return status if predicate(status) else None
