"""What the MIG partitioning workflows take and return: the per-node NodeMigReconfigure and the fleet run."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from temporalio.common import SearchAttributePair

from activities.kube.models import DrainSettings
from activities.kube.topology import BatchBy, TopologyLabels
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from workflows.budget.budget import Budget
from workflows.budget.leases import Lease
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput
from workflows.common.endpoints import RetryTimeout
from workflows.maintenance.drain import DrainCost, DrainProgress
from workflows.partitioning.layouts import MODELS, known_configs
from workflows.partitioning.plan import NodePlan, QuotaCheck
from workflows.rollout.spec.admission import BatchGate, MaintenanceWindow
from workflows.rollout.spec.deployment_policy import DeploymentPolicy
from workflows.rollout.spec.label_selector import LabelSelector
from workflows.rollout.spec.spec import BATCH_BY_DOC, TOPOLOGY_DOC, Approval
from workflows.rollout.spec.spec_fields import Duration
from workflows.rollout.state import RolloutCheckpoint
from workflows.validation.models import ValidationResult, ValidationSettings


def validate_config(value: str) -> str:
    # Our table, not mig-parted's list: mig-parted has built-ins for models it lacks (H100 NVL's all-1g.12gb).
    if value not in known_configs():
        raise ValueError(
            f"{value!r} is no config of a GPU model in Millwright's MIG profile table "
            f"({', '.join(m.name for m in MODELS)}): a model it lacks needs its row there first; "
            f"one of: {', '.join(known_configs())}"
        )
    return value


class MigDrainSettings(DrainSettings):
    """A MIG change's drain: only the pods that use GPUs leave unless `gpu_pods_only` is false."""

    gpu_pods_only: bool = Field(True, description="Only drain pods that use GPUs; false: every pod, as kubectl drain.")


class MigLayout(StrictModel):
    """How every node moves to its layout, in any cluster: a campaign (workflows/campaign/) gives each the same."""

    config: str = Field(description="The mig-parted config name, e.g. 'all-1g.10gb', 'all-balanced', 'all-disabled'.")
    drain: MigDrainSettings = Field(default_factory=MigDrainSettings, description="How each node is drained.")
    validation: ValidationSettings | None = Field(
        None, description="The validation gate before a node's uncordon (its MIG mode checked against the layout); "
        "None: none.",
    )  # fmt: skip
    reconfigure_timeout: timedelta = Field(
        timedelta(minutes=30), gt=timedelta(0), description="How long mig-manager may take, reboots included."
    )
    pending_timeout: timedelta = Field(
        timedelta(minutes=10), gt=timedelta(0),
        description="How long the state label may stay missing or `pending` before the node is reported.",
    )  # fmt: skip
    disruption_budget: Budget | None = Field(
        None, description="The cluster's disruption budget, if it has none set yet (default 10% of its nodes)."
    )

    _config = field_validator("config")(validate_config)


class MigChange(MigLayout):
    """How every node of a run moves to its layout: shared by the fleet run and each node's child."""

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")

    _cluster = field_validator("cluster")(validate_object_name)


class NodeMigInput(StrictModel):
    node: str
    ordinal: int = 0
    by: str = Field(description="The fleet run's workflow ID: owner of the cordon, named in the node's state.")
    change: MigChange
    lease: Lease | None = Field(None, description="The lease its batch was granted for the node; None: it asks.")

    _node = field_validator("node")(validate_object_name)


NodeMigOutcome = Literal["reconfigured", "at-target", "erroring"]


class NodeMigResult(DrainCost):
    node: str
    outcome: NodeMigOutcome
    reason: str = Field("", description="Why the node is erroring: mig-manager's reason, or what was seen.")
    previous: str | None = Field(None, description="The node's MIG config before.")
    mig_state: str | None = Field(None, description="The last `nvidia.com/mig.config.state` seen.")
    resources: dict[str, int] = Field(default_factory=dict, description="GPU resources advertised at the end.")
    evicted: list[str] = Field(default_factory=list)
    validation: ValidationResult | None = None
    seconds: float = Field(0, description="How long mig-manager took.")


class NodeMigStatus(DrainProgress):
    step: str = "starting"
    paused: bool = False
    lease: str | None = None
    waiting_for: str = ""


HOSTNAME_LABEL = "kubernetes.io/hostname"


class GpuPartitioningSpec(MigLayout, RetryTimeout):
    """What a GPU partitioning moves, where in a cluster and how fast: its input but its cluster (and the state a
    continued run carries), so a campaign (workflows/campaign/) gives every cluster the same spec.

    The fields the fleet engine reads (workflows/rollout/spec/fleet.py) are the rollout spec's sections, in its
    camelCase (snake_case accepted)."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True)

    name: str = Field(description="Change id; names the run (and its workflow).")
    node_selectors: LabelSelector = Field(default_factory=LabelSelector, description="The nodes to move.")
    nodes: list[str] = Field(default_factory=list, description="Or the nodes to move, by name.")
    deployment_policy: DeploymentPolicy = Field(default_factory=DeploymentPolicy)
    approval: Approval = Field("none", description="Wait for approve_batch before each batch or each compartment.")
    batch_by: BatchBy = Field("none", description=BATCH_BY_DOC)
    topology: TopologyLabels = Field(default_factory=TopologyLabels, description=TOPOLOGY_DOC)
    maintenance_windows: list[MaintenanceWindow] = Field(default_factory=list, description="Empty: any time.")
    soak_time: Duration = Field(timedelta(0), ge=timedelta(0), description="Wait after each batch.")
    gate: BatchGate | None = Field(None, description="A check that must pass before each batch.")
    max_in_flight: int = Field(200, ge=1, le=500, description="Nodes of one batch moved at once.")
    non_interrupt_retry_interval: Duration = Field(
        timedelta(minutes=1), gt=timedelta(0), description="A node left `blocked` is tried again after this."
    )
    allow_quota_shortfall: bool = Field(
        False, description="Go on although the tenants' guaranteed GPU quotas would no longer fit (recorded)."
    )
    dry_run: bool = Field(False, description="Only check and plan; write nothing.")

    _name = field_validator("name")(validate_object_name)
    _listed = field_validator("nodes")(lambda names: [validate_object_name(n) for n in names])

    @model_validator(mode="after")
    def _one_way_to_name_nodes(self) -> GpuPartitioningSpec:
        by_name = self.listed()
        if self.nodes and not self.node_selectors.is_empty() and self.node_selectors != by_name:
            raise ValueError("nodes: give nodeSelectors or nodes, not both")
        if not self.nodes and self.node_selectors.is_empty():
            raise ValueError("nodeSelectors: an empty selector matches every node; select the nodes or list them")
        if self.nodes:
            self.node_selectors = by_name  # what the engine surveys
        return self

    def listed(self) -> LabelSelector:
        return LabelSelector.model_validate(
            {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(self.nodes)}]}
            if self.nodes else {}
        )  # fmt: skip

    def resets_batch_state(self) -> bool:
        return self.deployment_policy.reset_batch_state_on_completion


class GpuPartitioningInput(GpuPartitioningSpec, MigChange, WorkflowInput):
    """Move GPU nodes (a label selector, or a list) to one MIG layout, under the rollout's DeploymentPolicy."""

    checkpoint: RolloutCheckpoint | None = Field(None, description="Internal: what a continued run carries.")
    quota_check: QuotaCheck | None = Field(None, description="Internal: the first run's capacity check, carried.")

    def change(self) -> MigChange:
        return MigChange.model_validate(self.model_dump(include=set(MigChange.model_fields), by_alias=False))

    def workflow_id(self) -> str:
        kind = "gpu-partitioning-plan" if self.dry_run else "gpu-partitioning"
        return f"{kind}/{self.cluster}/{self.name}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster),
                SearchAttributePair(sa.PHASE, "planning" if self.dry_run else "pending")]  # fmt: skip


class CompartmentMove(StrictModel):
    name: str
    strategy: str
    members: list[str]
    ceiling: int = Field(description="The most of its nodes out of service at once.")


class GpuPartitioningPlan(StrictModel):
    nodes: list[NodePlan]
    compartments: list[CompartmentMove] = Field(default_factory=list)


class GpuPartitioningResult(DrainCost):
    cluster: str
    name: str
    config: str
    outcome: Literal["completed", "aborted", "planned"]
    counts: dict[str, int] = Field(default_factory=dict, description="Nodes by state at the end.")
    problems: dict[str, str] = Field(default_factory=dict, description="Nodes that did not complete, with why.")
    warnings: list[str] = Field(default_factory=list, description="What the counts do not say: no node matched.")
    quota_check: QuotaCheck | None = Field(None, description="The tenants' GPU guarantees against the new layout.")
    plan: GpuPartitioningPlan | None = Field(None, description="With dryRun: what the run would do.")
