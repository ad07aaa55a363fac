"""FleetGpuPartitioning across two small clusters (two Kubernetes emulators with MIG nodes: conftest.py,
tests/workflows/partitioning/helpers.py) on a real dev server: the canary's GpuPartitioning, the approval after it
through the CLI (`millwright campaign approve NAME` finds the campaign of either type by its name), then the wave's."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest_asyncio

from lab.k8s.admin import EmulatorAdmin
from tests.cli_in_process import cli
from tests.kube_helpers import declare_lab_budget, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.partitioning.helpers import mig_lab
from workflows.campaign.fleet_gpu_partitioning import FleetGpuPartitioning
from workflows.campaign.models import FleetGpuPartitioningInput

CLUSTERS = ["east", "west"]  # the emulators (conftest.py)
GPU_NODES = {"gpu-01", "gpu-02"}


@pytest_asyncio.fixture(loop_scope="session")
async def labs(emulators, client, campaign_worker):
    """Each cluster emptied, then two MIG-capable GPU nodes (each with a trainer) and two spares, its budget declared."""
    admins = {c: EmulatorAdmin(e.url) for c, e in emulators.items()}
    for cluster, admin in admins.items():
        await admin.reset()
        await mig_lab(admin, count=len(GPU_NODES))
        await declare_lab_budget(client, campaign_worker.task_queue, cluster=cluster)
    yield admins
    for admin in admins.values():
        await admin.aclose()


def campaign() -> FleetGpuPartitioningInput:
    tag = uuid.uuid4().hex[:6]
    partitioning = {
        "name": f"slices-{tag}", "config": "all-1g.10gb", "nodeSelectors": {"matchLabels": {"mig": "true"}},
        "deploymentPolicy": {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}},
        "drain": {"timeout": "PT2M", "eviction_retry_interval": 0.2},
    }  # fmt: skip
    return FleetGpuPartitioningInput.model_validate({
        "name": f"inference-{tag}", "clusters": CLUSTERS, "partitioning": partitioning,
        "plan": {"canary": "west", "soak": "PT1S", "approve_after_canary": True}})  # fmt: skip


async def test_canary_then_wave_each_cluster_its_own_gpu_partitioning(client, campaign_worker, labs, temporal_address):
    inp = campaign()
    handle = await client.start_workflow(
        FleetGpuPartitioning.run, inp, id=inp.workflow_id(), task_queue=campaign_worker.task_queue
    )

    async def awaiting_approval():
        status = await handle.query(FleetGpuPartitioning.status)
        return status if status.awaiting_approval else None

    status = await wait_for(awaiting_approval, what="the wait for approval after the canary", timeout=120)
    assert status.clusters["west"].state == "completed" and status.clusters["east"].state == "pending"
    shown = await cli("status", handle.id, "--address", temporal_address)
    name = inp.partitioning.name
    assert re.search(rf"west +0 +completed +gpu-partitioning/west/{name} +complete=2", shown.stdout), shown.stdout
    listed = await cli("ls", "--family", "FleetGpuPartitioning", "--address", temporal_address)
    assert "west=completed east=pending" in listed.stdout, listed.stdout
    approved = await cli("campaign", "approve", inp.name, "--by", "alice", "--address", temporal_address,
                         "--reason", "canary fine")  # fmt: skip
    assert approved.returncode == 0 and "approved by: alice" in approved.stdout, approved.stderr
    result = await handle.result()

    assert result.outcome == "completed" and result.waves == [["west"], ["east"]]
    west, east = result.clusters["west"], result.clusters["east"]
    assert all(o.state == "completed" and o.counts == {"complete": 2} for o in (west, east)), result
    assert east.started - west.ended >= timedelta(seconds=1), result  # after the canary's soak
    # Each cluster's child is the GpuPartitioning the CLI would start, and it moved its own cluster's nodes only.
    for cluster, admin in labs.items():
        assert result.clusters[cluster].workflow_id == f"gpu-partitioning/{cluster}/{name}"
        child = await client.get_workflow_handle(result.clusters[cluster].workflow_id).describe()
        assert child.workflow_type == "GpuPartitioning" and child.task_queue == campaign_worker.task_queue
        assert {c["node"] for c in await admin.mig_config_changes()} == GPU_NODES, cluster
    progress = await handle.query(FleetGpuPartitioning.progress)
    assert progress.finished and progress.done == progress.total == 2
    await record_history(handle, "fleet_gpu_partitioning")
