"""What the MIG partitioning workflows take and return: the per-node NodeMigReconfigure and the fleet run."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator

from activities.kube.models import DrainSettings
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from workflows.budget.budget import Budget
from workflows.budget.leases import Lease
from workflows.maintenance.drain import DrainProgress
from workflows.partitioning.layouts import known_configs
from workflows.validation.models import ValidationResult, ValidationSettings


def validate_config(value: str) -> str:
    if value not in known_configs():
        raise ValueError(f"{value!r} is not a mig-parted built-in config; one of: {', '.join(known_configs())}")
    return value


class MigChange(StrictModel):
    """How every node of a run moves to its layout: shared by the fleet run and each node's child."""

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    config: str = Field(description="The mig-parted config name, e.g. 'all-1g.10gb', 'all-balanced', 'all-disabled'.")
    drain: DrainSettings = Field(
        default_factory=lambda: DrainSettings(gpu_pods_only=True),
        description="How each node is drained; by default only the pods that use GPUs leave (gpu_pods_only).",
    )
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

    _cluster = field_validator("cluster")(validate_object_name)
    _config = field_validator("config")(validate_config)


class NodeMigInput(StrictModel):
    node: str
    ordinal: int = 0
    by: str = Field(description="The fleet run's workflow ID: owner of the cordon, named in the node's state.")
    change: MigChange
    lease: Lease | None = Field(None, description="The lease its batch was granted for the node; None: it asks.")

    _node = field_validator("node")(validate_object_name)


NodeMigOutcome = Literal["reconfigured", "at-target", "erroring"]


class NodeMigResult(StrictModel):
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
