"""NodeMigReconfigure on the emulator's mig-manager: one node moved to a MIG layout (only its GPU pods drained, the
label set once they are gone, the layout advertised, back in service), a re-run that writes nothing, and a node
mig-manager fails, left cordoned and erroring with mig-manager's reason; with DRA, the layout read from the node's
ResourceSlice; a state stuck in `pending` past its bound, reported; a node failing the validation gate kept cordoned."""

from __future__ import annotations

import uuid
from datetime import timedelta

from activities.kube.mig import CONFIG_LABEL, STATE_LABEL
from activities.kube.models import ROLLOUT_ANNOTATION, ROLLOUT_STATE_LABEL
from tests.kube_helpers import pods_on, read_node
from tests.workflows.partitioning.helpers import evictions_past_their_budget, mig_lab
from workflows.partitioning.models import MigChange, NodeMigInput
from workflows.partitioning.node_mig import NodeMigReconfigure
from workflows.validation.models import ValidationSettings


async def move(client, worker, node: str, config: str = "all-1g.10gb", **change):
    by = f"gpu-partitioning/lab/{uuid.uuid4().hex[:6]}"
    inp = NodeMigInput(node=node, by=by, change=MigChange(cluster="lab", config=config, **change))
    return await client.execute_workflow(NodeMigReconfigure.run, inp, id=f"{by}/{node}", task_queue=worker.task_queue)


async def test_a_node_moves_to_its_layout_with_only_its_gpu_pods_drained(client, kube_worker, k8s, core):
    await mig_lab(k8s, 2)
    web_before = {p.metadata.name for p in await pods_on(core, "gpu-01") if p.metadata.namespace == "apps"}

    result = await move(client, kube_worker, "gpu-01")

    assert result.outcome == "reconfigured", result.reason
    assert [e.split("/")[0] for e in result.evicted] == ["training"] and result.mig_state == "success"
    assert result.resources == {"nvidia.com/mig-1g.10gb": 56}
    node = await read_node(core, "gpu-01")
    assert not node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    assert node.status.capacity["nvidia.com/mig-1g.10gb"] == "56" and node.status.capacity["nvidia.com/gpu"] == "0"
    assert {p.metadata.name for p in await pods_on(core, "gpu-01") if p.metadata.namespace == "apps"} == web_before
    [change] = await k8s.mig_config_changes()
    assert (change["node"], change["to"], change["gpuPods"]) == ("gpu-01", "all-1g.10gb", [])
    assert not evictions_past_their_budget(await k8s.audit())

    since = (await k8s.audit())[-1]["seq"]
    again = await move(client, kube_worker, "gpu-01")
    assert again.outcome == "at-target" and again.evicted == []
    assert not [e for e in await k8s.audit(since=since, writes=True) if e["resource"] == "nodes"]


async def test_a_node_mig_manager_fails_stays_cordoned_erroring_with_its_reason(client, kube_worker, k8s, core):
    await mig_lab(k8s, 2)
    await k8s.set_mig_node("gpu-02", fail="nvidia-smi mig -cgi failed: Insufficient Resources")

    result = await move(client, kube_worker, "gpu-02")

    assert result.outcome == "erroring" and result.mig_state == "failed"
    assert "Insufficient Resources" in result.reason and result.reason.startswith("mig-manager failed to apply")
    node = await read_node(core, "gpu-02")
    assert node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "erroring"
    assert "Insufficient Resources" in node.metadata.annotations[ROLLOUT_ANNOTATION]
    assert node.metadata.labels[CONFIG_LABEL] == "all-1g.10gb" and node.metadata.labels[STATE_LABEL] == "failed"


async def test_with_dra_the_layout_is_checked_in_the_nodes_resource_slice(client, kube_worker, k8s):
    await mig_lab(k8s, 1)
    await k8s.configure(migDra=True)

    result = await move(client, kube_worker, "gpu-01", "all-balanced")

    assert result.outcome == "reconfigured", result.reason
    assert result.resources == {"nvidia.com/mig-1g.10gb": 16, "nvidia.com/mig-2g.20gb": 8, "nvidia.com/mig-3g.40gb": 8}
    [slice_] = [o for o in await k8s.dump() if o["kind"] == "ResourceSlice"]
    assert slice_["spec"]["nodeName"] == "gpu-01" and len(slice_["spec"]["devices"]) == 32


async def test_a_state_that_stays_pending_past_its_bound_is_reported(client, kube_worker, k8s, core):
    await mig_lab(k8s, 1)
    await k8s.set_mig_node("gpu-01", pending_seconds=60)

    result = await move(client, kube_worker, "gpu-01", pending_timeout=timedelta(seconds=1))

    assert result.outcome == "erroring" and result.mig_state == "pending"
    assert result.reason == "nvidia.com/mig.config.state stayed pending for 0:00:01 after setting all-1g.10gb"
    assert (await read_node(core, "gpu-01")).spec.unschedulable  # cordoned, with the reason on the node


async def test_the_validation_gate_keeps_a_node_that_fails_it_cordoned(client, kube_worker, k8s, core):
    await mig_lab(k8s, 1)  # no host agent runs for gpu-01: its GPU check cannot pass

    result = await move(
        client, kube_worker, "gpu-01", validation=ValidationSettings(agent_timeout=timedelta(seconds=1))
    )

    assert result.outcome == "erroring" and result.mig_state == "success" and result.validation is not None
    assert result.reason == "validation failed: no host agent on gpu-01 answered within 0:00:01"
    node = await read_node(core, "gpu-01")
    assert node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "erroring"
    assert [c.status for c in node.status.conditions if c.type == "MillwrightValidated"] == ["False"]
