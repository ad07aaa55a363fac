"""FleetGpuPartitioning: one MIG layout across clusters (`fleet-gpu-partitioning/<name>`), a `GpuPartitioning` per
cluster, the canary first and then waves, on the campaign engine FleetRollout runs on (workflows/campaign/campaign.py).

Each child is the GpuPartitioning the CLI would start for that cluster (`gpu-partitioning/<cluster>/<name>`, the ID
GpuPartitioningInput.workflow_id gives), with its own checks before any write (the layout for every selected node's
GPU model, the tenants' quotas): a cluster they refuse fails, counted against `plan.max_failed_clusters`.
"""

from __future__ import annotations

from temporalio import workflow

from workflows.campaign.campaign import Campaign, CampaignControls, fleet_run
from workflows.campaign.models import CampaignResult, FleetGpuPartitioningInput
from workflows.partitioning.models import GpuPartitioningResult


@workflow.defn
class FleetGpuPartitioning(CampaignControls):
    @workflow.init
    def __init__(self, inp: FleetGpuPartitioningInput) -> None:
        self._campaign = Campaign(
            inp.clusters,
            inp.plan,
            fleet_run("GpuPartitioning", "GPU partitioning", GpuPartitioningResult, inp.partitioning.for_cluster),
        )

    @workflow.run
    async def run(self, inp: FleetGpuPartitioningInput) -> CampaignResult:
        return await self._campaign.result(inp.name)
