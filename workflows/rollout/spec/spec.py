"""The rollout spec: what a progressive host-OS rollout installs, where, and how fast.

One pydantic model, `RolloutInput`, is the workflow input. Field names mirror
NVIDIA NodeWright (formerly Skyhook) so its users feel at home: the JSON names are
NodeWright's camelCase (`nodeSelectors`, `dependsOn`, `deploymentPolicy`,
`initialBatch`, ...); Python attributes are snake_case, and either spelling is accepted.

Every spec error is rejected here, before any node is touched, with the field path in
the message: pydantic prefixes the path of the model a validator sits on; cross-field
checks made at the top level put the full path in their own text
(`packages.foo.dependsOn.bar: unknown package 'bar'`). `describe_errors` turns a
`ValidationError` into one `path: message` line per error.

Where NodeWright is unsafe, Millwright is safe by default:

* an empty `nodeSelectors` is rejected unless `allNodes: true` (NodeWright: all nodes);
* without a `deploymentPolicy` the rollout goes one node at a time (NodeWright: all nodes at once);
* `safetyLimit` defaults to 100, so a `failureThreshold` keeps stopping the rollout after
  the halfway point (NodeWright: 50);
* drains have a finite default timeout (30 min) and `stageTimeout` cannot be unbounded;
* `drainConfig.disableEviction: true` is refused: PodDisruptionBudgets always hold;
* drains do not delete emptyDir data nor force-evict unmanaged pods unless asked
  (NodeWright defaults both to true);
* a `dependsOn` version that differs from the dependency's version in the spec is
  rejected (in NodeWright it is never satisfied and the package never runs);
* dependency cycles are rejected (NodeWright's check is incomplete);
* the budget is a hard cap on each batch (see `workflows.rollout.batching.admissible`).

The sections live in their own modules under workflows/rollout/spec/: packages.py, label_selector.py,
drain_config.py, deployment_policy.py and admission.py (windows and gates), on the field types of
spec_fields.py. All are pure (stdlib + pydantic) and passed through the workflow sandbox (worker/registry.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from temporalio.common import SearchAttributePair

from activities.kube.topology import BatchBy, TopologyLabels
from activities.kube.validators import validate_object_name, validate_positive_duration
from activities.models import StrictModel
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput
from workflows.rollout.dependency_graph import DependencyCycle, dependency_levels
from workflows.rollout.spec.admission import BatchGate, MaintenanceWindow
from workflows.rollout.spec.deployment_policy import DeploymentPolicy, DeploymentPolicyOptions
from workflows.rollout.spec.drain_config import DrainConfig
from workflows.rollout.spec.label_selector import LabelSelector
from workflows.rollout.spec.packages import PACKAGE_NAME, Package
from workflows.rollout.spec.spec_fields import Duration
from workflows.rollout.state import RolloutCheckpoint
from workflows.validation.models import ValidationSettings


def describe_errors(error: ValidationError) -> list[str]:
    """One `path: message` line per error, for a CLI or a pre-flight report."""
    lines = []
    for e in error.errors():
        path = ".".join(str(p) for p in e["loc"])
        message = e["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}" if path else message)
    return lines


Approval = Literal["none", "batch", "compartment"]
# Shared by every fleet run's input (workflows/rollout/spec/fleet.py).
BATCH_BY_DOC = (
    "What a batch takes whole: nvlinkDomain or rack (and every unit a running gang spans, so each gang is interrupted "
    "once), or none: nodes one by one (docs/rollout-batch-planning.md)."
)
TOPOLOGY_DOC = "The node label keys that say where a node sits (its NVLink domain, rack, block), read with batchBy."


class RolloutSpec(StrictModel):
    """What a rollout installs, where in a cluster and how fast: a Rollout's input but its cluster (and the state a
    continued run carries), so a campaign (workflows/campaign/) gives every cluster the same spec."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True)

    name: str = Field(description="Change id; names the rollout (and its workflow).")
    all_nodes: bool = Field(False, description="Required to target every node (an empty nodeSelectors).")
    node_selectors: LabelSelector = Field(default_factory=LabelSelector)
    packages: dict[str, Package] = Field(min_length=1)
    pod_non_interrupt_labels: LabelSelector | None = Field(
        None, description="Pods that must finish before a node is drained. Omit to protect none."
    )
    non_interrupt_retry_interval: Duration = Field(
        timedelta(minutes=1),
        description="A node left alone because its non-interruptible pods still run is tried again after this.",
    )
    drain_config: DrainConfig = Field(default_factory=DrainConfig)
    deployment_policy: DeploymentPolicy = Field(default_factory=DeploymentPolicy)
    deployment_policy_options: DeploymentPolicyOptions = Field(default_factory=DeploymentPolicyOptions)
    approval: Approval = Field("none", description="Wait for approve_batch before each batch or each compartment.")
    batch_by: BatchBy = Field("none", description=BATCH_BY_DOC)
    topology: TopologyLabels = Field(default_factory=TopologyLabels, description=TOPOLOGY_DOC)
    maintenance_windows: list[MaintenanceWindow] = Field(
        default_factory=list, description="Empty: any time. Otherwise no node is admitted outside them."
    )
    soak_time: Duration = Field(timedelta(0), description="Wait after each batch before judging the next.")
    gate: BatchGate | None = Field(None, description="A check that must pass before each batch.")
    max_in_flight: int = Field(
        200,
        ge=1,
        le=500,
        description="Nodes of one batch updated at once (a few hundred at most keeps histories small).",
    )
    stage_retries: int = Field(
        3, ge=0, le=10, description="Retries of a failed stage Job (NodeWright's backoff limit)."
    )
    reboot_timeout: Duration = Field(
        timedelta(minutes=30), description="A rebooted node must be Ready again within this."
    )
    allow_downgrade: bool = Field(
        False, description="Install a package over a later version a node has (else that node is refused, untouched)."
    )
    runtime_required: bool = Field(
        False,
        description="A node's packages must be complete before it takes work: the runtime-required taint "
        "(nodewright.nvidia.com=runtime-required:NoSchedule) is removed from it once they are, never while they fail.",
    )
    auto_taint_new_nodes: bool = Field(
        False,
        description="Give each new node (none of Millwright's annotations yet) the runtime-required taint "
        "when the rollout reaches it; needs runtimeRequired.",
    )
    validation: ValidationSettings | None = Field(
        None,
        description="Checks each node must pass after its packages and before its uncordon (docs/validation.md); "
        "a node that fails stays cordoned and counts as failed. Omit (or enabled: false) for none.",
    )
    dry_run: bool = Field(False, description="Only compute and report the plan; write nothing.")

    _name = field_validator("name")(validate_object_name)

    @field_validator("packages")
    @classmethod
    def _package_names(cls, value: dict[str, Package]) -> dict[str, Package]:
        for name in value:
            if not PACKAGE_NAME.match(name):
                raise ValueError(
                    f"packages.{name}: a package name must match {PACKAGE_NAME.pattern} (NodeWright's rule)"
                )
        return value

    @field_validator("pod_non_interrupt_labels")
    @classmethod
    def _protect_explicitly(cls, value: LabelSelector | None) -> LabelSelector | None:
        if value is not None and value.is_empty():
            raise ValueError(
                "an empty selector protects every pod in Kubernetes and none in NodeWright; "
                "omit the field to protect none"
            )
        return value

    @field_validator("soak_time")
    @classmethod
    def _soak(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("must not be negative")
        return value

    _positive = field_validator("reboot_timeout", "non_interrupt_retry_interval")(validate_positive_duration)

    @model_validator(mode="after")
    def _cross_field(self) -> RolloutSpec:
        if self.node_selectors.is_empty() and not self.all_nodes:
            raise ValueError(
                "nodeSelectors: an empty selector matches every node; set allNodes: true to target all nodes on purpose"
            )
        if self.all_nodes and not self.node_selectors.is_empty():
            raise ValueError("allNodes: true conflicts with a non-empty nodeSelectors; use one or the other")
        if self.auto_taint_new_nodes and not self.runtime_required:
            raise ValueError("autoTaintNewNodes: the taint it places is removed only with runtimeRequired: true")
        for name in sorted(self.packages):
            for dep, version in sorted(self.packages[name].depends_on.items()):
                path = f"packages.{name}.dependsOn.{dep}"
                if dep not in self.packages:
                    raise ValueError(f"{path}: unknown package {dep!r}")
                if self.packages[dep].uninstall.apply and not self.packages[name].uninstall.apply:
                    raise ValueError(f"{path}: {dep!r} is being uninstalled (uninstall.apply) and {name!r} is not: "
                                     "uninstall both or neither")  # fmt: skip
                if dep == name:
                    raise ValueError(f"{path}: a package cannot depend on itself")
                if version != self.packages[dep].version:
                    raise ValueError(
                        f"{path}: depends on version {version} but the spec installs {self.packages[dep].version}"
                    )
        try:
            dependency_levels({n: p.depends_on for n, p in self.packages.items()})
        except DependencyCycle as err:
            raise ValueError(f"packages.{err.cycle[0]}.dependsOn: {err}") from None
        return self

    def resets_batch_state(self) -> bool:
        """`resetBatchStateOnCompletion`: the rollout's override, else the policy's."""
        override = self.deployment_policy_options.reset_batch_state_on_completion
        return self.deployment_policy.reset_batch_state_on_completion if override is None else override

    def package_versions(self) -> dict[str, str]:
        return {name: p.version for name, p in sorted(self.packages.items())}


class RolloutInput(RolloutSpec, WorkflowInput):
    """A progressive host-OS rollout of `packages` to the nodes selected by `nodeSelectors`."""

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    checkpoint: RolloutCheckpoint | None = Field(
        None, description="Internal: the state a continued run carries. Leave it out when starting a rollout."
    )

    _cluster = field_validator("cluster")(validate_object_name)

    def workflow_id(self) -> str:
        # A dry run never collides with (or attaches to) the rollout it plans.
        return f"rollout-plan/{self.cluster}/{self.name}" if self.dry_run else f"rollout/{self.cluster}/{self.name}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [
            SearchAttributePair(sa.CLUSTER, self.cluster),
            SearchAttributePair(sa.PHASE, "planning" if self.dry_run else "pending"),
        ]
