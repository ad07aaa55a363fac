"""FleetRollout: one rollout across clusters (`fleet-rollout/<name>`), a `Rollout` per cluster, the canary first
and then waves (workflows/campaign/campaign.py says how, and what it costs in history events).

Each child is the Rollout the CLI would start for that cluster (`rollout/<cluster>/<name>`, the ID
RolloutInput.workflow_id gives): one run per change and cluster whoever starts it, so a campaign never runs a
second rollout of the same change beside one started by hand (its start is refused and the cluster fails, saying
so), and `millwright status rollout/<cluster>/<name>` shows a campaign's cluster as any rollout.
"""

from __future__ import annotations

from temporalio import workflow

from workflows.campaign.campaign import Campaign, CampaignControls, fleet_run
from workflows.campaign.models import CampaignResult, FleetRolloutInput
from workflows.rollout.models import RolloutResult


@workflow.defn
class FleetRollout(CampaignControls):
    @workflow.init
    def __init__(self, inp: FleetRolloutInput) -> None:
        self._campaign = Campaign(
            inp.clusters, inp.plan, fleet_run("Rollout", "rollout", RolloutResult, inp.rollout.for_cluster)
        )

    @workflow.run
    async def run(self, inp: FleetRolloutInput) -> CampaignResult:
        return await self._campaign.result(inp.name)
