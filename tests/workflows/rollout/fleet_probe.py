"""A fleet workflow of the tests' own on the rollout's engine, with a per-node child that is not a NodeUpdate: what
another fleet run (firmware, GPU partitioning) supplies, and no more. Its own module, so the sandbox imports these
workflows without the test module's imports."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import Field
from temporalio import workflow

from activities.kube.models import StageRecord
from activities.kube.topology import BatchBy, TopologyLabels
from activities.models import StrictModel
from workflows.rollout.compartments import Compartments
from workflows.rollout.fleet_controls import FleetControls
from workflows.rollout.models import NodeOutcome, NodeWork
from workflows.rollout.spec.admission import BatchGate, MaintenanceWindow
from workflows.rollout.spec.deployment_policy import DeploymentPolicy
from workflows.rollout.spec.label_selector import LabelSelector
from workflows.rollout.spec.spec import Approval
from workflows.rollout.state import RolloutCheckpoint


class ProbeNodeInput(StrictModel):
    node: str
    ordinal: int
    setting: str
    refuse: list[str] = Field(default_factory=list)


class ProbeNodeResult(StrictModel):
    done: bool
    note: str


@workflow.defn
class ProbeNode:
    @workflow.run
    async def run(self, inp: ProbeNodeInput) -> ProbeNodeResult:
        if inp.node in inp.refuse:
            return ProbeNodeResult(done=False, note=f"{inp.node} refused {inp.setting}")
        return ProbeNodeResult(done=True, note=f"{inp.setting} on {inp.node} as #{inp.ordinal}")


class ProbeFleetInput(StrictModel):
    cluster: str
    name: str
    node_selectors: LabelSelector
    deployment_policy: DeploymentPolicy = Field(default_factory=DeploymentPolicy)
    approval: Approval = "none"
    batch_by: BatchBy = "none"
    topology: TopologyLabels = Field(default_factory=TopologyLabels)
    maintenance_windows: list[MaintenanceWindow] = Field(default_factory=list)
    soak_time: timedelta = timedelta(0)
    gate: BatchGate | None = None
    max_in_flight: int = 10
    non_interrupt_retry_interval: timedelta = timedelta(minutes=1)
    checkpoint: RolloutCheckpoint | None = None
    setting: str
    refuse: list[str] = Field(default_factory=list)

    def resets_batch_state(self) -> bool:
        return self.deployment_policy.reset_batch_state_on_completion


def probe_outcome(result: Any) -> NodeOutcome:
    res = ProbeNodeResult.model_validate(result)
    stage = StageRecord(package="probe", stage="set", succeeded=res.done, attempts=1, message=res.note)
    return NodeOutcome(outcome="complete" if res.done else "erroring", reason=res.note, stages=[stage])


@workflow.defn
class ProbeFleet(FleetControls):
    @workflow.init
    def __init__(self, inp: ProbeFleetInput) -> None:
        work = NodeWork(
            workflow="ProbeNode",
            cluster=inp.cluster,
            id_prefix=workflow.info().workflow_id,
            input={"setting": inp.setting, "refuse": inp.refuse},
            ordinal_field="ordinal",
        )
        self._fleet = Compartments(inp, work=lambda: work, read=probe_outcome, noun="probe")

    @workflow.run
    async def run(self, inp: ProbeFleetInput) -> dict[str, str]:
        if inp.checkpoint is None:
            await self._fleet.start()
        await self._fleet.run()
        if self._fleet.continues():
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(inp.model_copy(update={"checkpoint": self._fleet.carry()}))
        problems = self._fleet.finish()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return problems
