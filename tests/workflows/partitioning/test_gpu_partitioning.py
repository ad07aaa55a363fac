"""GpuPartitioning in the lab: GPU nodes moved from whole GPUs to `all-1g.10gb` under a budget of 2 (the audit: at
most 2 out of service, no eviction past a PodDisruptionBudget, no relabel under a GPU pod, the layout advertised
after), a re-run that writes nothing, a node mig-manager fails stopping the run at its threshold with the reason in
`progress` and an abort leaving every node in service or cordoned with a reason, and a layout that would break a
tenant's guaranteed quota refused before any write, naming the tenant; a node that failed, alone under a ceiling of 1,
retried (its retry costs nothing more) and moved; a selector matching no node, said so."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError

from activities.capi.ownership import TENANT_LABEL
from activities.kube.mig import CONFIG_LABEL
from activities.kube.models import ROLLOUT_ANNOTATION, ROLLOUT_STATE_LABEL
from lab.k8s.crds import TENANCY_CRDS
from tests.cli_in_process import cli
from tests.kube_helpers import pods_on, read_node, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.partitioning.helpers import evictions_past_their_budget, mig_lab
from tests.workflows.rollout.helpers import max_unavailable
from workflows.partitioning.gpu_partitioning import GpuPartitioning
from workflows.partitioning.models import GpuPartitioningInput
from workflows.rollout.models import ApproveRequest

MEMBERS = {f"gpu-{i:02d}" for i in range(1, 5)}
BUDGET_2 = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}


def partitioning(name: str, **fields: Any) -> GpuPartitioningInput:
    return GpuPartitioningInput.model_validate({
        "cluster": "lab", "name": name, "config": "all-1g.10gb", "nodeSelectors": {"matchLabels": {"mig": "true"}},
        "deploymentPolicy": BUDGET_2, "drain": {"timeout": "PT2M", "eviction_retry_interval": 0.2}, **fields})  # fmt: skip


async def start(client, worker, inp: GpuPartitioningInput):
    return await client.start_workflow(GpuPartitioning.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                       task_queue=worker.task_queue)  # fmt: skip


async def test_the_fleet_moves_to_1g_slices_two_nodes_at_a_time(client, kube_worker, k8s, core):
    await mig_lab(k8s)
    web = {p.metadata.name for n in MEMBERS for p in await pods_on(core, n) if p.metadata.namespace == "apps"}

    handle = await start(client, kube_worker, partitioning("slices"))
    result = await handle.result()

    assert result.outcome == "completed" and result.counts == {"complete": 4}, result.problems
    assert result.quota_check is not None and result.quota_check.gpus_after == result.quota_check.gpus_before == 48
    audit = await k8s.audit()
    assert max_unavailable(audit, MEMBERS) <= 2
    assert not evictions_past_their_budget(audit)
    changes = await k8s.mig_config_changes()
    assert sorted(c["node"] for c in changes) == sorted(MEMBERS) and all(c["gpuPods"] == [] for c in changes)
    for name in sorted(MEMBERS):
        node = await read_node(core, name)
        assert not node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete", name
        gpu = {k: v for k, v in node.status.capacity.items() if k.startswith("nvidia.com/")}
        assert gpu == {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}, name
    # CPU-only pods stayed where they were; the trainers moved to the spare whole-GPU nodes.
    assert {p.metadata.name for n in MEMBERS for p in await pods_on(core, n) if p.metadata.namespace == "apps"} == web
    await record_history(handle, "gpu_partitioning")
    async for child in client.list_workflows(f"WorkflowId = '{handle.id}/gpu-01'"):
        await record_history(
            client.get_workflow_handle(child.id, run_id=child.run_id), "node_mig_reconfigure_decided_early"
        )

    since = audit[-1]["seq"]
    again = await (await start(client, kube_worker, partitioning("slices-again"))).result()
    assert again.counts == {"complete": 4}
    assert not [e for e in await k8s.audit(since=since, writes=True) if e["resource"] in ("nodes", "pods")]


async def test_a_failing_node_stops_the_run_at_its_threshold_and_an_abort_leaves_nodes_accounted_for(
    client, kube_worker, k8s, core, temporal_address
):
    await mig_lab(k8s)
    await k8s.set_mig_node("gpu-01", fail="nvidia-smi mig -cgi failed: In use by another client")
    policy = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}}}}
    handle = await start(client, kube_worker, partitioning("threshold", deploymentPolicy=policy))

    async def stopped():
        progress = await handle.query(GpuPartitioning.progress)
        return progress if progress.phase == "stopped" else None

    progress = await wait_for(stopped, what="the failure threshold", timeout=60)
    assert "node `gpu-01` erroring: mig-manager failed to apply all-1g.10gb" in progress.details
    assert "In use by another client" in progress.details
    # The operator's view and control, as a rollout's: `millwright status`, `millwright mig abort`.
    shown = await cli("status", handle.id, "-o", "json", "--address", temporal_address)
    problem = json.loads(shown.stdout)["rollout"]["problems"]["gpu-01"]
    assert problem["status"] == "erroring" and "In use by another client" in problem["reason"], shown.stdout
    aborted = await cli(
        "mig", "abort", handle.id, "--by", "sre", "--reason", "bad layout", "--address", temporal_address
    )
    assert aborted.returncode == 0, aborted.stderr
    result = await handle.result()
    assert result.outcome == "aborted" and result.counts == {"erroring": 1, "waiting": 3}
    failed = await read_node(core, "gpu-01")
    assert failed.spec.unschedulable and failed.metadata.labels[ROLLOUT_STATE_LABEL] == "erroring"
    assert "In use by another client" in failed.metadata.annotations[ROLLOUT_ANNOTATION]
    for name in sorted(MEMBERS - {"gpu-01"}):  # never touched
        node = await read_node(core, name)
        assert not node.spec.unschedulable and "nvidia.com/mig.config" not in node.metadata.labels, name


async def test_a_node_left_cordoned_by_its_own_failure_is_retried_under_a_ceiling_of_1(client, kube_worker, k8s, core):
    # Issue 43: the retry was counted among the nodes out of service, filled the ceiling, and the run waited forever.
    await mig_lab(k8s, 1)
    await k8s.set_mig_node("gpu-01", fail="nvidia-smi mig -cgi failed: In use by another client")
    policy = {"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}}}  # retryErroringNodes: 1
    handle = await start(client, kube_worker, partitioning("retry", deploymentPolicy=policy, approval="batch"))

    async def awaiting_approval(batch: int):
        progress = await handle.query(GpuPartitioning.progress)
        return progress if f"waiting-for-approval (batch {batch}," in progress.details else None

    await wait_for(lambda: awaiting_approval(1), what="batch 1's approval")
    await handle.execute_update(GpuPartitioning.approve_batch, ApproveRequest(approver="sre"))
    progress = await wait_for(lambda: awaiting_approval(2), what="batch 2's approval", timeout=60)
    assert "node `gpu-01` erroring: mig-manager failed" in progress.details
    # The operator mends the node: mig-manager's fault gone, its config label removed so the retry sets it again.
    await k8s.set_mig_node("gpu-01")
    await core.patch_node("gpu-01", {"metadata": {"labels": {CONFIG_LABEL: None}}})
    await handle.execute_update(GpuPartitioning.approve_batch, ApproveRequest(approver="sre"))

    async def finished():
        progress = await handle.query(GpuPartitioning.progress)
        assert "waiting-for-budget" not in progress.details, progress.details
        return progress if progress.finished else None

    await wait_for(finished, what="the retry of gpu-01", timeout=60)
    result = await handle.result()
    assert result.outcome == "completed" and result.counts == {"complete": 1}, result.problems
    status = await handle.query(GpuPartitioning.status)
    assert [b.retried for b in status.recent_batches] == [[], ["gpu-01"]]
    node = await read_node(core, "gpu-01")
    assert not node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    assert node.status.capacity["nvidia.com/mig-1g.10gb"] == "56"
    await record_history(handle, "gpu_partitioning_retry_out_of_service")


async def test_a_selector_that_matches_no_node_is_said_so_not_reported_as_an_empty_success(client, kube_worker, k8s):
    await mig_lab(k8s, 1)
    handle = await start(client, kube_worker, partitioning("none", nodeSelectors={"matchLabels": {"mig": "nowhere"}}))

    result = await handle.result()

    assert result.outcome == "completed" and result.counts == {}
    assert result.warnings == ["the node selectors matched no node"]
    progress = await handle.query(GpuPartitioning.progress)
    assert progress.finished and "the node selectors matched no node" in progress.details, progress.details


async def test_a_layout_breaking_a_tenants_guarantee_is_refused_before_any_write(client, kube_worker, k8s):
    await mig_lab(k8s)
    queues = [("tenants", None, -1, None), ("nlp", "tenants", 30, "nlp"), ("vision", "tenants", 14, "vision")]
    await k8s.seed(TENANCY_CRDS + [
        {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
         "metadata": {"name": name, "labels": {TENANT_LABEL: tenant} if tenant else {}},
         "spec": {"parentQueue": parent, "resources": {"gpu": {"quota": quota, "limit": -1, "overQuotaWeight": 1}}}}
        for name, parent, quota, tenant in queues])  # fmt: skip
    since = (await k8s.audit())[-1]["seq"]

    # 4 nodes of 8 H100s at 6/7 each, and 16 spare whole GPUs: 43.4 GPUs for 44 guaranteed.
    with pytest.raises(WorkflowFailureError) as err:
        await (await start(client, kube_worker, partitioning("shrink", config="all-3g.40gb"))).result()
    cause = err.value.cause
    assert getattr(cause, "type", None) == "QuotaShortfall", cause
    assert "nlp (30 GPUs), vision (14 GPUs) would no longer fit" in str(cause)
    assert not [e for e in await k8s.audit(since=since, writes=True) if e["userAgent"].startswith("millwright")]

    allowed = await (await start(client, kube_worker, partitioning("shrink-anyway", config="all-3g.40gb",
                                                                   allowQuotaShortfall=True, dryRun=True))).result()  # fmt: skip
    assert allowed.outcome == "planned" and allowed.quota_check.overridden and not allowed.quota_check.fits
    assert [c.members for c in allowed.plan.compartments] == [sorted(MEMBERS)]
