"""The models of a rollout's runs: what ``Rollout``, ``RolloutBatch`` and ``NodeUpdate`` take, return and show.

Pure data, kept out of the workflow modules: the worker passes this module through the sandbox once
(worker/registry.py), so a new run (one per node, one per batch) does not build these classes again.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field, model_validator

from activities.kube.models import DrainSettings, StageRecord
from activities.models import StrictModel
from workflows.budget.budget import Budget
from workflows.budget.leases import Lease
from workflows.maintenance.drain import DrainCost, DrainProgress
from workflows.rollout.batching import Plan
from workflows.rollout.spec.admission import MaintenanceWindow
from workflows.rollout.spec.packages import Interrupt
from workflows.rollout.state import BatchState, NodeStatus
from workflows.validation.models import ValidationResult, ValidationSettings

# ---------------------------------------------------------------- NodeUpdate

Outcome = Literal["complete", "erroring", "blocked"]


class PackageStep(StrictModel):
    name: str
    version: str
    image: str
    config: dict[str, str] = Field(default_factory=dict)
    has_interrupt: bool = False
    stage_timeout: timedelta = timedelta(hours=1)


class NodeUpdateTemplate(StrictModel):
    """What every node of a rollout shares."""

    cluster: str
    rollout: str = Field(description="The rollout's workflow ID: owner of the cordons and Jobs.")
    packages: list[PackageStep] = Field(description="In dependency order.")
    interrupt: Interrupt | None = Field(None, description="The coalesced interrupt; None: no drain, no interrupt.")
    drain: DrainSettings
    non_interrupt_selector: str | None = None
    stage_retries: int = 3
    reboot_timeout: timedelta = timedelta(minutes=30)
    disruption_budget: Budget | None = Field(
        None, description="The rollout's own budget: its leases stay within it, inside the cluster's (its worst case)."
    )
    uninstall: list[PackageStep] = Field(
        default_factory=list, description="Packages to uninstall where installed (uninstall.apply), dependents first."
    )
    uninstall_interrupt: Interrupt | None = Field(
        None, description="The coalesced interrupt of the packages uninstalled (uninstall-interrupt)."
    )
    allow_downgrade: bool = Field(False, description="Install over later versions (else the node is refused).")
    runtime_required: bool = Field(False, description="Remove the runtime-required taint once the node completes.")
    auto_taint_new_nodes: bool = Field(False, description="Taint a new node runtime-required before its update.")
    validation: ValidationSettings | None = Field(None, description="Checks the node must pass before its uncordon.")

    @property
    def out_of_service(self) -> bool:
        """An interrupt (install or uninstall) is due: the node is leased, cordoned and drained first."""
        return self.interrupt is not None or self.uninstall_interrupt is not None


class NodeUpdateInput(StrictModel):
    node: str
    ordinal: int
    template: NodeUpdateTemplate
    lease: Lease | None = Field(
        None, description="The disruption budget lease its batch was granted for the node; None: it asks itself."
    )


class NodeUpdateResult(DrainCost):
    node: str
    outcome: Outcome
    reason: str = ""
    stages: list[StageRecord] = Field(default_factory=list)
    validation: ValidationResult | None = Field(None, description="The validation gate's verdict, when it ran.")
    drain_seconds: float | None = None
    reboot_seconds: float | None = None


class NodeUpdateStatus(DrainProgress):
    stage: str = "starting"
    package: str | None = None
    paused: bool = False
    stages: list[StageRecord] = Field(default_factory=list)
    lease: str | None = Field(None, description="The disruption budget lease held for the node.")
    waiting_for: str = Field("", description="Why the node waits for the disruption budget.")
    running: list[str] = Field(
        default_factory=list,
        description="The stages it runs now, in order ('<package> <stage>'); the one under way "
        "is on the node, in the millwright.dev/rollout annotation's stage.",
    )


# ---------------------------------------------------------------- RolloutBatch


class BatchNode(StrictModel):
    node: str
    ordinal: int


class NodeWork(StrictModel):
    """The per-node child a RolloutBatch starts for each of its nodes: a rollout's NodeUpdate, or any other fleet
    run's node operation (workflows/rollout/compartments.py). The child's ID, and the holder of the node's lease,
    is `<id_prefix>/<node>`."""

    workflow: str = Field(description="The child workflow's type, e.g. 'NodeUpdate'.")
    cluster: str
    id_prefix: str = Field(description="The fleet run's workflow ID.")
    input: dict[str, Any] = Field(
        description="The child's input as JSON, the same for every node but the fields below."
    )
    node_field: str = Field("node", description="The input field that gets the node's name.")
    ordinal_field: str | None = Field(None, description="The input field that gets the node's order in the run.")
    lease_field: str | None = Field(
        None, description="The input field that gets the node's disruption budget lease, which the batch takes "
        "before starting the child; None: the batch takes none (the child leaves the node in service).",
    )  # fmt: skip
    budget: Budget | None = Field(None, description="The budget the leases state (workflows/budget/leases.py).")
    lease_reason: str = Field("", description="Why the nodes are leased, as the budget shows it.")
    pause_signal: str | None = Field(None, description="The child's signal to hold; None: a pause only stops starts.")
    resume_signal: str | None = Field(None, description="The child's signal to carry on after `pause_signal`.")


class NodeOutcome(StrictModel):
    """What a fleet run reads from a per-node child's result (the fleet's own `read` function makes it)."""

    outcome: Outcome
    reason: str = ""
    stages: list[StageRecord] = Field(default_factory=list, description="Shown in the run's status for the node.")
    cost: DrainCost = Field(default_factory=DrainCost, description="What the node's drain cost the GPU work on it.")


class BatchInput(StrictModel):
    compartment: str
    number: int
    nodes: list[BatchNode]
    work: NodeWork | None = Field(None, description="The per-node child; absent in batches started before it.")
    template: NodeUpdateTemplate | None = Field(None, description="Batches started before `work`: NodeUpdate's.")
    windows: list[MaintenanceWindow] = Field(default_factory=list)
    max_in_flight: int = Field(200, description="Per-node children running at once.")
    results: dict[str, NodeUpdateResult] = Field(
        default_factory=dict, description="Carried across continue-as-new by batches started before `work`."
    )
    outputs: dict[str, Any] = Field(default_factory=dict, description="Children's results (JSON), carried across "
                                    "continue-as-new.")  # fmt: skip

    @model_validator(mode="after")
    def _names_its_work(self) -> BatchInput:
        if self.work is None and self.template is None:
            raise ValueError("work: a batch needs its per-node work")
        return self


class BatchResult(StrictModel):
    results: dict[str, NodeUpdateResult] = Field(
        default_factory=dict, description="Node -> its NodeUpdate's result, from batches started before `work`."
    )
    outputs: dict[str, Any] = Field(default_factory=dict, description="Node -> its child's result (JSON).")
    not_started: list[str] = Field(default_factory=list, description="Left untouched because the rollout was aborted.")

    def raw(self) -> dict[str, Any]:
        """Every node's result as JSON, whichever field it came in."""
        return {n: r.model_dump(mode="json") for n, r in self.results.items()} | self.outputs


# ---------------------------------------------------------------- Rollout

CompartmentPhase = Literal[
    "pending",
    "running",
    "paused",
    "waiting-for-window",
    "waiting-for-approval",
    "gate-failing",
    "waiting-for-budget",
    "waiting-for-blocked-nodes",
    "stopped",
    "done",
]


class NodeView(StrictModel):
    status: NodeStatus
    reason: str = ""
    stages: list[StageRecord] = Field(default_factory=list)
    retries: int = Field(0, description="Times the rollout put the node in a later batch after it ended erroring.")


class BatchView(StrictModel):
    compartment: str
    number: int
    ceiling: int
    unavailable_before: int = Field(description="Compartment nodes out of service when the batch was admitted.")
    strategy_size: int
    completed: int = 0
    nodes: dict[str, NodeView] = Field(default_factory=dict, description="Nodes that did not complete, with why.")
    started: datetime
    finished: datetime | None = None
    success_percent: int | None = None
    order: list[str] = Field(default_factory=list, description="The batch's nodes in the order they start.")
    retried: list[str] = Field(default_factory=list, description="Erroring nodes this batch tries again.")
    joined: list[str] = Field(default_factory=list, description="Nodes the re-read before this batch added.")
    left: list[str] = Field(default_factory=list, description="Nodes the re-read before this batch removed.")
    units: dict[str, list[str]] = Field(
        default_factory=dict, description="With batchBy: the units (NVLink domains, racks) it took -> their nodes."
    )
    gangs: list[str] = Field(default_factory=list, description="With batchBy: the running gangs it interrupted.")


class CompartmentView(StrictModel):
    name: str
    strategy: str
    members: int
    ceiling: int
    phase: CompartmentPhase = "pending"
    note: str = ""
    topology: str = Field("", description="With batchBy: what batches take whole, and nodes alone in their domain.")
    batch_state: BatchState
    current_batch: BatchView | None = None


class RolloutStatus(DrainCost):
    phase: str
    paused_reason: str | None = None
    aborted: str | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    compartments: dict[str, CompartmentView] = Field(default_factory=dict)
    recent_batches: list[BatchView] = Field(default_factory=list)
    problems: dict[str, NodeView] = Field(default_factory=dict, description="Erroring, blocked and skipped nodes.")
    joined: dict[str, str] = Field(
        default_factory=dict, description="Nodes that started matching mid-rollout -> the compartment they joined."
    )
    left: dict[str, NodeStatus] = Field(
        default_factory=dict, description="Nodes that stopped matching mid-rollout -> their state when they left."
    )


class RolloutResult(DrainCost):
    cluster: str
    name: str
    outcome: Literal["completed", "aborted", "planned"]
    counts: dict[str, int] = Field(default_factory=dict)
    problems: dict[str, str] = Field(default_factory=dict, description="Node → why it is erroring, blocked or skipped.")
    compartments: dict[str, BatchState] = Field(default_factory=dict)
    plan: Plan | None = None


class ReasonRequest(StrictModel):
    reason: str = Field(min_length=1)


class ApproveRequest(StrictModel):
    approver: str = Field(min_length=1)
    compartment: str | None = Field(None, description="Which compartment's batch; any awaiting one when omitted.")


class NodeRequest(StrictModel):
    node: str
    reason: str = Field(min_length=1)


class CompartmentRequest(StrictModel):
    compartment: str
    reason: str = Field(min_length=1)
