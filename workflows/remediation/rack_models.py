"""RackRemediation's input, status and result (workflows/remediation/rack_remediation.py), and the ID every starter
derives for it: the sweep, the event path (worker/fault_events.py) and `millwright rack remediate` start at most
one run per NVLink domain."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator
from temporalio.common import SearchAttributePair

from activities.kube.models import DrainSettings
from activities.kube.racks import RackCheck
from activities.kube.topology import TopologyLabels
from activities.kube.validators import validate_object_name, validate_positive_duration
from activities.models import StrictModel
from activities.redfish import BmcRef
from workflows.budget.breaker import BreakerSettings
from workflows.budget.budget import Budget
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput
from workflows.common.endpoints import RetryTimeout
from workflows.maintenance.drain import DrainCost, DrainProgress
from workflows.remediation.models import RemediationSettings
from workflows.validation.models import ValidationSettings

RackOutcome = Literal["healthy", "partly-healthy", "held-out", "failed", "refused", "skipped", "dry-run"]
NodeVerdict = Literal["pending", "returned", "failed-alone", "held-out", "not-ours"]
RackStep = Literal["power-cycle"]
DEFAULT_ESCALATION_SHARE = 0.5  # a domain with at least this share of its nodes unhealthy is remediated whole


STAND_DOWN_SIGNAL = "stand_down"  # to a NodeRemediation of the domain's node: the rack run takes the node over
STAND_DOWN_TIMEOUT = timedelta(minutes=10)  # how long a rack run waits for its nodes' own runs to stand down


class StandDown(StrictModel):
    """The `stand_down` signal: a RackRemediation remediates the node's whole domain. A NodeRemediation that has not
    touched its node yet ends `stood-down` at once; one that has ends after its current step, its cordon handed to
    `by` (activities/kube `hand_over_cordon`)."""

    by: str = Field(min_length=1, description="The RackRemediation's workflow ID.")
    reason: str = Field("", max_length=1024)


def rack_workflow_id(cluster: str, rack: str) -> str:
    """One RackRemediation per domain (named by `activities.kube.topology.rack_key`): a second start finds the
    first, whichever of the sweep, the event path or an operator asks."""
    return f"rack-remediation/{cluster}/{rack}"


class RackSettings(RetryTimeout):
    """How a domain is remediated whole: what every starter passes on (the sweep's and the event path's
    `escalation.rack`), apart from what names the domain and why."""

    drain: DrainSettings = Field(default_factory=DrainSettings, description="How each node is drained (gangs "
                                 "across the domain are evicted together).")  # fmt: skip
    bmcs: dict[str, BmcRef] = Field(default_factory=dict, description="Each compute tray's BMC by node name; a node "
                                    "missing here is looked up in NetBox (netbox: true), else the run is refused.")  # fmt: skip
    switch_bmcs: list[BmcRef] = Field(default_factory=list, description="The rack's NVLink switch trays' BMCs: "
                                      "powered off after the compute trays and on before them; empty: not modelled.")  # fmt: skip
    netbox: bool = Field(False, description="Look a tray's BMC up in NetBox when `bmcs` lacks it.")
    require_approval_for: list[RackStep] = Field(default_factory=list, description="Steps that wait for an "
                                                 "operator's `approve` / `reject` update.")  # fmt: skip
    approval_timeout: timedelta = Field(timedelta(hours=1), description="How long to wait for an approval.")
    default_on_timeout: Literal["approve", "reject"] = Field("reject", description="What an approval nobody gave "
                                                             "within approval_timeout becomes.")  # fmt: skip
    power_timeout: timedelta = Field(timedelta(minutes=5), description="How long a tray's BMC may take to report "
                                     "a power state.")  # fmt: skip
    ready_timeout: timedelta = Field(timedelta(minutes=20), description="Power-on to every node Ready with a new "
                                     "boot ID.")  # fmt: skip
    fabric_timeout: timedelta = Field(timedelta(minutes=10), description="Then, how long the clique label may take "
                                      "to come back on every node (the fabric manager's state complete).")  # fmt: skip
    validation: ValidationSettings | None = Field(None, description="The validation gate each node passes before "
                                                  "it returns; None: the cluster's default (docs/validation.md).")  # fmt: skip
    domain_check: RackCheck | None = Field(default_factory=RackCheck, description="The domain-wide check: one "
                                           "multi-node Job across the domain's nodes; None: none.")  # fmt: skip
    disruption_budget: bool = Field(True, description="Lease the whole domain from the cluster's budget first.")
    budget: Budget | None = Field(None, description="This run's own budget, inside the cluster's.")

    _durations = field_validator("approval_timeout", "power_timeout", "ready_timeout",
                                 "fabric_timeout")(validate_positive_duration)  # fmt: skip

    @field_validator("require_approval_for")
    @classmethod
    def _unique(cls, steps: list[RackStep]) -> list[RackStep]:
        return list(dict.fromkeys(steps))


class RackRemediationInput(WorkflowInput, RackSettings):
    """Remediate one NVLink domain (an NVL72 rack) of one cluster as a whole, for a stated reason."""

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    domain: str = Field(min_length=1, max_length=253, description="The domain: its rack (Topograph's accelerator "
                        "label) or its NVLink ClusterUUID; the run is named by the rack when the nodes have one.")  # fmt: skip
    reason: str = Field(min_length=1, max_length=1024, description="Why; recorded on every node.")
    topology: TopologyLabels = Field(default_factory=TopologyLabels, description="Which labels say where a node sits.")
    breaker: BreakerSettings = Field(default_factory=BreakerSettings, description="The cluster's remediation "
                                     "circuit breaker, judging the domain's nodes as one request.")  # fmt: skip
    node_remediation: RemediationSettings = Field(default_factory=RemediationSettings, description="The "
                                                  "NodeRemediation a node that fails alone is handed to.")  # fmt: skip
    requested_by: str | None = Field(None, min_length=1, max_length=256, description="The operator who asked.")
    dry_run: bool = Field(False, description="Read the domain and say what would be done; touch nothing.")

    _cluster = field_validator("cluster")(validate_object_name)

    def workflow_id(self) -> str:
        return rack_workflow_id(self.cluster, self.domain)

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster)]


class RackApproval(StrictModel):
    step: RackStep | None = Field(None, description="The step being decided; None: whichever waits now.")
    by: str = Field(min_length=1, description="Who decides.")
    comment: str = ""


class RackNodeState(DrainProgress):
    """One node of the domain, as the run sees it."""

    node: str
    tray: int | None = Field(None, description="Its compute tray's index in the rack (the BMC's ComputeTrayIndex).")
    verdict: NodeVerdict = "pending"
    cordoned_by_us: bool = False
    powered: list[str] = Field(default_factory=list, description="The power states set, in order (Off, On).")
    detail: str = ""


class RackRemediationStatus(StrictModel):
    phase: str = "starting"
    domain: str = Field("", description="The NVLink ClusterUUID, once read.")
    rack: str = Field("", description="The rack the run is named by.")
    nodes: list[RackNodeState] = Field(default_factory=list)
    lease: bool = False
    awaiting_approval: str | None = Field(
        None, description="The step waiting for `approve` / `reject`, and until when."
    )
    power_order: list[str] = Field(default_factory=list, description="The BMCs in the order they are powered off "
                                   "(and, switch trays first, on).")  # fmt: skip
    domain_check: str = Field("", description="The domain-wide check's verdict.")
    note: str = ""

    def node(self, name: str) -> RackNodeState:
        return next(n for n in self.nodes if n.node == name)


class RackRemediationResult(DrainCost):
    cluster: str
    rack: str
    domain: str = ""
    outcome: RackOutcome
    reason: str
    nodes: list[str] = Field(default_factory=list, description="The domain's nodes, tray order.")
    returned: list[str] = Field(default_factory=list, description="Nodes back in service, together.")
    held_out: list[str] = Field(default_factory=list, description="Nodes left cordoned with the domain's reason.")
    handed_to_node_remediation: list[str] = Field(default_factory=list, description="Nodes that failed alone: "
                                                  "handed, cordoned, to their own NodeRemediation.")  # fmt: skip
    power_cycles: int = Field(0, description="Trays powered off and on by this run.")
    domain_check: str = ""
    note: str = ""
