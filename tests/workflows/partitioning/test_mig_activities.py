"""The MIG activities against the Kubernetes emulator: the drain leaves CPU-only pods where gpu_pods_only says so,
the config label is never set while a GPU pod runs on the node, and a state label that never comes is reported."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.kube.mig import (
    CONFIG_LABEL,
    STATE_LABEL,
    MigActivities,
    MigConfigWait,
    MigConfigWrite,
    MigNodesRequest,
)
from activities.kube.models import DrainPlanRequest, DrainSettings
from lab.fleet import Fleet
from tests.kube_helpers import pods_on, read_node
from tests.workflows.partitioning.helpers import H100, mig_fleet


async def test_only_gpu_pods_are_drained_and_no_label_is_set_under_them(k8s, kube, core):
    await k8s.seed(mig_fleet(2))
    await k8s.configure(migPendingSeconds=60)  # mig-manager holds its `pending` while the test looks
    mig = MigActivities(kube._clusters)
    env = ActivityEnvironment()
    plan = await env.run(kube.plan_drain, DrainPlanRequest(cluster="lab", node="gpu-01",
                                                           settings=DrainSettings(gpu_pods_only=True)))  # fmt: skip
    assert [p.namespace for p in plan.evict] == ["training"]
    assert {(s.pod.namespace, s.reason) for s in plan.skipped} == {
        ("apps", "uses no GPU"),
        ("gpu-operator", "uses no GPU"),
    }

    await core.patch_node("gpu-01", {"metadata": {"labels": {STATE_LABEL: "success"}}})
    write = MigConfigWrite(cluster="lab", node="gpu-01", config="all-1g.10gb", by="test")
    with pytest.raises(ApplicationError) as err:
        await env.run(mig.set_mig_config, write)
    assert (
        err.value.type == "MigGpuPodsRunning" and err.value.non_retryable and "training/trainer-" in err.value.message
    )
    assert CONFIG_LABEL not in (await read_node(core, "gpu-01")).metadata.labels

    await core.patch_node("gpu-01", {"spec": {"unschedulable": True}})  # its replacement lands elsewhere, or nowhere
    trainer = next(p for p in await pods_on(core, "gpu-01") if p.metadata.namespace == "training")
    await core.delete_namespaced_pod(trainer.metadata.name, "training", grace_period_seconds=0)
    assert (await env.run(mig.set_mig_config, write)).written
    labels = (await read_node(core, "gpu-01")).metadata.labels
    assert labels[CONFIG_LABEL] == "all-1g.10gb" and labels[STATE_LABEL] == "pending"  # the stale success is gone
    assert not (await env.run(mig.set_mig_config, write)).written  # a retry writes nothing

    seen = await env.run(mig.mig_nodes, MigNodesRequest(cluster="lab", selector="mig=true"))
    assert [(n.name, n.selected, n.product, n.gpus, n.config) for n in seen.nodes] == [
        ("gpu-01", True, H100, 8, "all-1g.10gb"), ("gpu-02", True, H100, 8, None),
        ("spare-01", False, H100, 8, None), ("spare-02", False, H100, 8, None)]  # fmt: skip


async def test_a_state_label_that_never_comes_is_reported_missing_not_guessed(k8s, kube, core):
    # A node mig-manager does not act on (no GPUs in the lab's hardware record): its state label never appears.
    await k8s.seed(Fleet.model_validate({"cluster": "lab", "nodes": [{"prefix": "cpu-", "count": 1, "gpus": 0}]})
                   .to_objects())  # fmt: skip
    await core.patch_node("cpu-01", {"metadata": {"labels": {CONFIG_LABEL: "all-1g.10gb"}}})
    wait = MigConfigWait(cluster="lab", node="cpu-01", config="all-1g.10gb", expected={"nvidia.com/mig-1g.10gb": 56},
                         timeout_seconds=30, pending_seconds=0.5, poll_seconds=0.1)  # fmt: skip
    seen = await ActivityEnvironment().run(MigActivities(kube._clusters).await_mig_config, wait)
    assert (seen.outcome, seen.state) == ("missing", None) and 0.5 <= seen.seconds < 10
