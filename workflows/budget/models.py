"""The DisruptionBudget entity's models: its input, an operator's budget change, a release's answer and the
`state` view (workflows/budget/disruption_budget.py runs the entity)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from temporalio.common import SearchAttributePair

from activities.kube.topology import TopologyLabels
from activities.kube.validators import validate_object_name, validate_positive_duration
from activities.models import StrictModel
from workflows.budget.book import BudgetBook
from workflows.budget.budget import Budget
from workflows.budget.control_plane import DEFAULT_AT_ONCE
from workflows.budget.leases import Lease, budget_workflow_id
from workflows.budget.units import UnitLimits
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput

HISTORY_LIMIT = 2000
IDLE_CLOSE = timedelta(minutes=5)


class Released(StrictModel):
    released: bool
    lease: Lease | None = None


NO_LIMIT = "none"
LimitChange = Annotated[int, Field(ge=1)] | Literal["none"] | None


class BudgetChange(StrictModel):
    budget: Budget
    control_plane_at_once: int | None = Field(
        None, ge=1, description="Control-plane nodes allowed out of service at once (default 1); unset: unchanged."
    )
    nvlink_domains: LimitChange = Field(
        None,
        description="NVLink domains allowed with any node out of service at once; 'none': no such limit; "
        "unset: unchanged.",
    )
    gangs: LimitChange = Field(
        None, description="Gangs of GPU work allowed disrupted at once; 'none': no such limit; unset: unchanged."
    )
    topology: TopologyLabels | None = Field(
        None, description="The node labels that say where a node sits, for the NVLink-domain limit; unset: unchanged."
    )
    by: str = Field(min_length=1, description="Who changes it.")
    reason: str = Field(min_length=1, description="Why; shown with the budget.")

    def limits(self, before: UnitLimits) -> UnitLimits:
        """The limits after this change."""
        changed: dict[str, Any] = {name: None if value == NO_LIMIT else value
                   for name, value in (("nvlink_domains", self.nvlink_domains), ("gangs", self.gangs))
                   if value is not None}  # fmt: skip
        if self.topology is not None:
            changed["topology"] = self.topology
        return before.model_copy(update=changed)


class DisruptionBudgetInput(WorkflowInput):
    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    budget: Budget | None = Field(
        None, description="The budget, as an operator declares it; unset: the one an operator set before, else 10%."
    )
    check_interval: timedelta = Field(
        timedelta(seconds=20), description="While requests wait: re-read the cluster and check holders this often."
    )
    liveness_interval: timedelta = Field(
        timedelta(seconds=60), description="While leases are held: check their holders' runs this often."
    )
    task_queue: str | None = Field(
        None,
        description="The task queue this run is on (requesters set it; by hand, say so). Unknown: the entity "
        "continues as new onto its first requester's queue.",
    )
    idle_close_after: timedelta = Field(
        IDLE_CLOSE, description="With nothing leased or waiting this long, close; the next request starts a new run."
    )
    history_limit: int = Field(HISTORY_LIMIT, ge=50, description="Continue-as-new past this many history events.")
    book: BudgetBook | None = Field(None, description="Carried across continue-as-new.")

    _cluster = field_validator("cluster")(validate_object_name)
    _durations = field_validator("check_interval", "liveness_interval", "idle_close_after")(validate_positive_duration)

    def workflow_id(self) -> str:
        return budget_workflow_id(self.cluster)

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster)]


class BudgetView(StrictModel):
    """The `state` query: the budget, what is out of service and why, leases and the queue."""

    cluster: str
    budget: Budget
    budget_source: str
    total_nodes: int | None = Field(None, description="At the last read of the cluster.")
    allowed: int | None = Field(None, description="Nodes allowed out of service at once, at the last read.")
    out_of_service: dict[str, str] = Field(default_factory=dict, description="Node -> why (lease, cordon, NotReady).")
    leases: list[Lease] = Field(default_factory=list)
    queue: list[Lease] = Field(default_factory=list)
    control_plane_at_once: int = Field(DEFAULT_AT_ONCE, description="Control-plane nodes allowed out at once.")
    own_budgets: dict[str, str] = Field(
        default_factory=dict, description="Requester -> the budget it stated for itself, and its leases within it."
    )
    limits: UnitLimits = Field(default_factory=UnitLimits, description="NVLink domains and gangs allowed out.")
    domains_out: dict[str, list[str]] = Field(
        default_factory=dict, description="With a limit, at the last read: NVLink domain -> its nodes out of service."
    )
    gangs_disrupted: dict[str, str] = Field(
        default_factory=dict, description="With a limit, at the last read: gang id -> why it is disrupted."
    )
    places: dict[str, str] = Field(
        default_factory=dict, description="With a limit, at the last read: node out of service -> where it sits."
    )
    checked_at: datetime | None = None
    error: str = ""


def operator_note(change: BudgetChange) -> str:
    """How an operator's change is named where the budget says where it came from."""
    return f"operator {change.by}: {change.reason}"
