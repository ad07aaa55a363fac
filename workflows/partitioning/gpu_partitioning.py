"""GpuPartitioning: a fleet of GPU nodes moved to one MIG layout, on the rollout's fleet engine.

Before any write, from one read of the cluster's GPU nodes and its KAI queues (workflows/partitioning/plan.py): the
layout must exist for every selected node's GPU model, and the tenants' guaranteed GPU quotas must still fit the
cluster once it is in place, unless `allow_quota_shortfall` (recorded in the result). Then the engine
(workflows/rollout/compartments.py: compartments, strategies, thresholds, gates, pause/resume/abort, leases from the
cluster's disruption budget per batch) runs one NodeMigReconfigure child per node (workflows/partitioning/node_mig.py).
A dry run stops after the checks, with the plan.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from activities.kube.mig import MigActivities, MigNodes, MigNodesRequest
from workflows.budget.budget import Budget, ceiling
from workflows.common.call_options import API_CALL
from workflows.common.endpoints import Endpoints
from workflows.partitioning.models import (
    CompartmentMove,
    GpuPartitioningInput,
    GpuPartitioningPlan,
    GpuPartitioningResult,
    NodeMigResult,
)
from workflows.partitioning.plan import NodePlan, QuotaCheck, check_quotas, plan_nodes
from workflows.rollout.batching import (
    assign_compartments,
    compartment_budget,
    compartment_strategy,
    strategy_name,
    unit_over_ceiling,
)
from workflows.rollout.compartments import MATCHED_NO_NODE, Compartments
from workflows.rollout.fleet_controls import FleetControls
from workflows.rollout.models import NodeOutcome, NodeWork
from workflows.tenancy.capacity import read_capacity


def node_outcome(result: Any) -> NodeOutcome:
    res = NodeMigResult.model_validate(result)
    return NodeOutcome(
        outcome="erroring" if res.outcome == "erroring" else "complete", reason=res.reason, cost=res.cost()
    )


@workflow.defn
class GpuPartitioning(FleetControls):
    @workflow.init
    def __init__(self, inp: GpuPartitioningInput) -> None:
        self._inp = inp
        self._fleet = Compartments(inp, work=self._work, read=node_outcome, noun="GPU partitioning",
                                   phase="planning" if inp.dry_run else "checking")  # fmt: skip

    def _work(self) -> NodeWork:
        inp, by = self._inp, workflow.info().workflow_id
        # The cluster's budget, if it has none yet: what this run alone may take out at once.
        budget = Budget(count=max(1, sum(ceiling(compartment_budget(inp.deployment_policy, name), len(cs.members))
                                         for name, cs in self._fleet.cp.compartments.items())))  # fmt: skip
        change = inp.change().model_copy(update={"disruption_budget": inp.disruption_budget or budget})
        return NodeWork(workflow="NodeMigReconfigure", cluster=inp.cluster, id_prefix=by,
                        input={"by": by, "change": change.model_dump(mode="json")}, ordinal_field="ordinal",
                        lease_field="lease", budget=change.disruption_budget, lease_reason=f"MIG {inp.config} ({by})",
                        pause_signal="pause", resume_signal="resume")  # fmt: skip

    @workflow.run
    async def run(self, inp: GpuPartitioningInput) -> GpuPartitioningResult:
        fleet = self._fleet
        quota = inp.quota_check
        result = GpuPartitioningResult(cluster=inp.cluster, name=inp.name, config=inp.config, outcome="completed")
        if inp.checkpoint is None:
            plans, quota = await self._check(inp)
            result.quota_check = quota
            if inp.dry_run:
                result.outcome, result.plan = "planned", await self._plan(plans, result.warnings)
                fleet.phase = "planned"
                fleet.refresh()
                return result
            fleet.phase = "surveying"
            await fleet.start()
        await fleet.run()
        if fleet.continues():
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(inp.model_copy(update={"checkpoint": fleet.carry(), "quota_check": quota}))
        result.problems = fleet.finish()
        await workflow.wait_condition(workflow.all_handlers_finished)
        result.outcome = "aborted" if fleet.aborted else "completed"
        result.counts, result.quota_check = fleet.counts(), quota
        result.add(fleet.cp.cost)
        if fleet.matched_no_node():
            result.warnings.append(MATCHED_NO_NODE)
        return result

    async def _check(self, inp: GpuPartitioningInput) -> tuple[list[NodePlan], QuotaCheck]:
        """The checks before any write (module docstring); refused for good, naming what does not fit."""
        self._fleet.refresh()
        found: MigNodes = await workflow.execute_activity_method(
            MigActivities.mig_nodes,
            MigNodesRequest(cluster=inp.cluster, selector=inp.node_selectors.to_selector_string(), nodes=inp.nodes),
            **API_CALL, summary="read the GPU nodes",
        )  # fmt: skip
        try:
            plans = plan_nodes(found.nodes, found.missing, inp.config)
        except ValueError as err:
            raise ApplicationError(f"config: {err}", type="MigConfigUnsupported", non_retryable=True) from None
        capacity = await read_capacity(Endpoints(inp.retry_timeout), inp.cluster)
        quota = check_quotas(found.nodes, plans, capacity.queues)
        if not quota.fits:
            if not inp.allow_quota_shortfall:
                raise ApplicationError(quota.refusal(inp.cluster, inp.config), type="QuotaShortfall",
                                       non_retryable=True)  # fmt: skip
            quota.overridden = True
        return plans, quota

    async def _plan(self, plans: list[NodePlan], warnings: list[str]) -> GpuPartitioningPlan:
        """The compartments the run would take; `warnings` gets why the run would be refused at its start."""
        policy = self._inp.deployment_policy
        nodes = await self._fleet.survey()
        members = assign_compartments(nodes, policy)
        if refusal := unit_over_ceiling(nodes, members, self._inp):  # batchBy: a unit over its ceiling
            warnings.append(refusal)
        moves = [CompartmentMove(name=name, strategy=strategy_name(compartment_strategy(policy, name)), members=names,
                                 ceiling=ceiling(compartment_budget(policy, name), len(names)))
                 for name, names in members.items() if names]  # fmt: skip
        return GpuPartitioningPlan(nodes=plans, compartments=moves)
