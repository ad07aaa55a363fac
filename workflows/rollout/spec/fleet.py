"""What the fleet engine (workflows/rollout/compartments.py) reads of a fleet run's input: the rollout spec's
sections that say which nodes, in which compartments, how fast and when. A fleet workflow's input has these fields
(RolloutInput has them), typed with the sections of this package so they validate the same way."""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from activities.kube.topology import BatchBy, TopologyLabels
from workflows.rollout.spec.admission import BatchGate, MaintenanceWindow
from workflows.rollout.spec.deployment_policy import DeploymentPolicy
from workflows.rollout.spec.label_selector import LabelSelector
from workflows.rollout.spec.spec import Approval
from workflows.rollout.state import RolloutCheckpoint


class FleetSpec(Protocol):
    """What the engine reads of a fleet run's input: the rollout spec's sections (workflows/rollout/spec/)."""

    cluster: str
    name: str
    node_selectors: LabelSelector
    deployment_policy: DeploymentPolicy
    approval: Approval
    batch_by: BatchBy
    topology: TopologyLabels
    maintenance_windows: list[MaintenanceWindow]
    soak_time: timedelta
    gate: BatchGate | None
    max_in_flight: int
    non_interrupt_retry_interval: timedelta
    checkpoint: RolloutCheckpoint | None

    def resets_batch_state(self) -> bool: ...
