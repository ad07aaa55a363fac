"""NodeRemediation's input, settings, status and result, and what a sweep knows of a server from NetBox: the
models both remediation workflows (workflows/remediation/node_remediation.py, health_sweep.py) share."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import Field, field_validator
from temporalio.common import SearchAttributePair

from activities.kube.models import DrainSettings
from activities.kube.validators import validate_object_name, validate_positive_duration
from activities.models import StrictModel
from activities.netbox.models import CF_BMC_CREDENTIALS, CF_BMC_URL, CF_EXPECTED_GPUS, CF_GPU_MODEL, DeviceInfo
from activities.notify import WebhookTarget
from activities.redfish import BmcRef
from workflows.budget.breaker import BreakerSettings
from workflows.budget.budget import Budget
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput
from workflows.common.endpoints import RetryTimeout
from workflows.maintenance.drain import DrainCost, DrainProgress
from workflows.remediation.policy import (
    DEFAULT_COOLDOWN,
    DecidedFrom,
    HealthChecks,
    remediation_workflow_id,
    validate_cooldown,
)
from workflows.validation.models import ValidationSettings

Step = Literal["restart-gpu-services", "reset-gpu", "power-cycle"]
STEPS: tuple[Step, ...] = ("restart-gpu-services", "reset-gpu", "power-cycle")
# left-cordoned: a run holding a node handed over to it cordoned, refused by the circuit breaker past its
# breaker_wait_limit (workflows/remediation/breaker_wait.py): the node is still cordoned in its name.
# stood-down: a RackRemediation took the node's whole domain over (the `stand_down` signal); its cordon, if any,
# handed to that run.
Outcome = Literal["healthy", "quarantined", "failed", "skipped", "refused", "left-cordoned", "stood-down"]
MAX_BREAKER_ASKS = 500  # a wait for the circuit breaker asks at most this often: its history stays bounded
StepOutcome = Literal["fixed", "not-fixed", "unavailable", "rejected", "failed"]


# ---------------------------------------------------------------- models


class RemediationSettings(RetryTimeout):
    """How a node is remediated: the ladder, approvals, timeouts, records. Shared by the sweep's children."""

    steps: list[Step] = Field(default_factory=lambda: list(STEPS), min_length=1,
                              description="The ladder, cheapest first; each step is tried once.")  # fmt: skip
    drain: DrainSettings = Field(default_factory=DrainSettings)
    require_approval_for: list[Step] = Field(
        default_factory=list, description="Steps that wait for an operator's `approve` / `reject` update."
    )
    approval_timeout: timedelta = Field(timedelta(hours=1), description="How long to wait for an approval.")
    default_on_timeout: Literal["approve", "reject"] = Field(
        "reject", description="What an approval nobody gave within approval_timeout becomes."
    )
    settle_timeout: timedelta = Field(
        timedelta(minutes=3), description="After a step, how long the node may take to look healthy."
    )
    settle_poll_interval: timedelta = Field(timedelta(seconds=10), description="How often to look meanwhile.")
    agent_timeout: timedelta = Field(
        timedelta(minutes=2), description="How long the host agent may take to pick up a task (none: unavailable)."
    )
    reboot_timeout: timedelta = Field(timedelta(minutes=20), description="Power cycle to Ready with a new boot ID.")
    burn_in_seconds: float = Field(60.0, gt=0, le=3600, description="The short GPU stress after a fix.")
    dcgm_level: int | None = Field(None, ge=1, le=4, description="dcgmi diag level during burn-in (when installed).")
    expected_gpus: int | None = Field(None, ge=0, le=64, description="GPUs the node must have (None: not checked).")
    gpu_model: str | None = Field(None, description="e.g. NVIDIA H200 (None: not checked).")
    validation: ValidationSettings | None = Field(None, description="Checks a fixed node must pass too before its "
                                                  "uncordon (docs/validation.md); failing them, the step did not fix it.")  # fmt: skip
    disruption_budget: bool = Field(True, description="Take a lease from the cluster's disruption budget first.")
    budget: Budget | None = Field(None, description="This run's own budget, inside the cluster's (set by an operator).")
    breaker: BreakerSettings = Field(default_factory=BreakerSettings, description="When the cluster's remediation "
                                     "circuit breaker trips (with disruption_budget: the entity holds it).")  # fmt: skip
    netbox: bool = Field(False, description="Record a quarantine in NetBox; look the BMC and GPUs up there.")
    webhook: WebhookTarget | None = Field(None, description="Where to notify a quarantine or a failure.")
    notify_timeout: timedelta = Field(
        timedelta(minutes=10), description="How long the webhook may keep failing (no answer, 5xx, 429) before the "
        "notification is given up; the outcome is recorded first, and the result's `notification` says what became "
        "of it.")  # fmt: skip
    breaker_retry_interval: timedelta = Field(
        timedelta(minutes=5), description="A run holding a node handed over to it cordoned (a FirmwareUpdate's "
        "failed validation) asks the disruption budget again this often while the circuit breaker refuses it, "
        "instead of ending `refused` (1 s to 1 h).")  # fmt: skip
    breaker_wait_limit: timedelta = Field(
        timedelta(hours=24), description="... for at most this long, and at most 500 asks: then it ends "
        "`left-cordoned`, the node still cordoned in its name.")  # fmt: skip

    _durations = field_validator("approval_timeout", "settle_timeout", "settle_poll_interval", "agent_timeout",
                                 "reboot_timeout", "notify_timeout", "breaker_wait_limit")(validate_positive_duration)  # fmt: skip

    @field_validator("breaker_retry_interval")
    @classmethod
    def _retry_interval(cls, value: timedelta) -> timedelta:
        if not timedelta(seconds=1) <= value <= timedelta(hours=1):
            raise ValueError("between 1 second and 1 hour")
        return value

    @field_validator("steps")
    @classmethod
    def _unique(cls, steps: list[Step]) -> list[Step]:
        if len(set(steps)) != len(steps):
            raise ValueError("each step at most once")
        return steps


class NodeRemediationInput(WorkflowInput, RemediationSettings):
    """Remediate one node of one cluster, for a stated reason."""

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    node: str = Field(description="Node name (also the host agent's name and the NetBox device name).")
    reason: str = Field(min_length=1, max_length=1024, description="Why; recorded on the node.")
    checks: HealthChecks = Field(default_factory=HealthChecks, description="What the success checks look at.")
    bmc: BmcRef | None = Field(None, description="The node's BMC; None: from NetBox (netbox: true), else no "
                               "power cycle.")  # fmt: skip
    cooldown: timedelta = Field(DEFAULT_COOLDOWN, description="A node remediated less than this long ago (its "
                                "millwright.dev/last-remediation annotation) is skipped at the start; 0: no "
                                "cooldown. A sweep passes its own.")  # fmt: skip
    requested_by: str | None = Field(None, min_length=1, max_length=256, description="The operator who asked for "
                                     "this run: then a quarantined, cooling-down or opted-out node is remediated "
                                     "all the same (remediating a quarantined node is how it is released).")  # fmt: skip
    decided_from: DecidedFrom | None = Field(None, description="Set by a sweep: Millwright's marks on the node when "
                                             "it decided; a run that finds the node written since is skipped.")  # fmt: skip

    _names = field_validator("cluster", "node")(validate_object_name)
    _cooldown = field_validator("cooldown")(validate_cooldown)

    def workflow_id(self) -> str:
        return remediation_workflow_id(self.cluster, self.node)

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster), SearchAttributePair(sa.NODE, self.node)]


class StepRecord(StrictModel):
    step: Step
    outcome: StepOutcome
    detail: str = ""
    approval: str | None = Field(None, description="Who approved or rejected, or 'default on timeout'.")


class Approval(StrictModel):
    step: Step | None = Field(None, description="The step being decided; None: whichever waits now.")
    by: str = Field(min_length=1, description="Who decides.")
    comment: str = ""


class AwaitingApproval(StrictModel):
    step: Step
    deadline: str
    default: Literal["approve", "reject"]


class NodeRemediationStatus(DrainProgress):
    phase: str = "starting"
    step: Step | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    awaiting_approval: AwaitingApproval | None = None
    lease: bool = False
    cordoned_by_us: bool = False
    problems: list[str] = Field(default_factory=list, description="What the last check found.")
    note: str = ""


class NodeRemediationResult(DrainCost):
    cluster: str
    node: str
    outcome: Outcome
    reason: str
    fixed_by: Step | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    uncordoned: bool = False
    quarantined: bool = False
    netbox: str | None = Field(None, description="What was recorded in NetBox, or why nothing was.")
    notified: bool = False
    notification: str | None = Field(None, description="The webhook notification: delivered, or failed after N "
                                     "attempts with the error (never the run's failure).")  # fmt: skip
    note: str = ""


class DeviceFacts(StrictModel):
    bmc: BmcRef | None = None
    gpus: int | None = None
    gpu_model: str | None = None


def device_facts(device: DeviceInfo) -> DeviceFacts:
    """The BMC and expected GPUs from a NetBox device's Millwright custom fields."""
    cf = device.custom_fields or {}
    bmc = None
    if cf.get(CF_BMC_URL):
        try:
            bmc = BmcRef(url=cf[CF_BMC_URL], credentials=cf.get(CF_BMC_CREDENTIALS) or None)
        except ValueError:
            bmc = None
    gpus = cf.get(CF_EXPECTED_GPUS)
    return DeviceFacts(bmc=bmc, gpus=gpus if isinstance(gpus, int) else None, gpu_model=cf.get(CF_GPU_MODEL) or None)


def server_facts(node: str, bmcs: dict[str, BmcRef], netbox: DeviceFacts | None = None) -> DeviceFacts:
    """What is known of `node`'s server: its NetBox device's facts, with the BMC of `bmcs` (an operator's map by
    node name) before NetBox's. The sweep and the event path (worker/fault_events.py) resolve a BMC by it."""
    facts = netbox or DeviceFacts()
    return facts.model_copy(update={"bmc": bmcs[node]}) if node in bmcs else facts


def finding_text(f: Any) -> str:
    where = f" GPU{f.gpu}" if getattr(f, "gpu", None) is not None else ""
    return f"{f.check}{where}: {f.evidence}"
