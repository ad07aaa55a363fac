"""What Millwright writes on a node (cordon ownership, rollout state, package Jobs' labels) and the request and result
models of the Kubernetes activities."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal, NamedTuple

from pydantic import Field, field_validator, model_validator

from activities.kube.node_plan import NodePlan, NodeStage
from activities.kube.topology import DEFAULT_CHECKPOINT_INTERVAL, Gang, NodePlace, TopologyLabels
from activities.kube.validators import validate_label_selector, validate_positive_duration
from activities.models import StrictModel

# Where Millwright records on a node that it placed the cordon, so it never
# removes a cordon placed by someone else.
CORDONED_BY = "millwright.dev/cordoned-by"
CORDON_REASON = "millwright.dev/cordon-reason"

# Node metadata Millwright writes during a rollout (NodeWright §6.2 keeps the same facts under its prefix).
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"  # the disruption budget spares these (one at a time)
ROLLOUT_STATE_LABEL = "millwright.dev/rollout-state"  # waiting|in_progress|complete|erroring|blocked|skipped
ROLLOUT_ANNOTATION = "millwright.dev/rollout"  # JSON {"rollout", "state", "package", "stage", "reason", "updated"}
PACKAGES_ANNOTATION = "millwright.dev/packages"  # JSON {"<package>": "<version>"}, installed and complete
ROLLOUT_STATES = ("waiting", "in_progress", "complete", "erroring", "blocked", "skipped")
NON_INTERRUPTIBLE_RUNNING = "non-interruptible pods running"

# Package Jobs (one per rollout, node, package, stage and activity execution).
JOB_NAMESPACE = "millwright-system"
JOB_TTL_SECONDS = 600  # ttlSecondsAfterFinished: finished Jobs (and their pods' logs) stay this long
JOB_POLL_SECONDS = 5.0  # the longest wait between two looks at a running Job
BEAT_SECONDS = 2.0  # a node's stages heartbeat at least this often, and at once when where they stand changes
JOB_WAIT_SLACK_SECONDS = 60.0  # how long past activeDeadlineSeconds the activity still waits for a verdict
JOB_NODE_LABEL = "millwright.dev/node"
JOB_PACKAGE_LABEL = "millwright.dev/package"
JOB_STAGE_LABEL = "millwright.dev/stage"
JOB_ROLLOUT_LABEL = "millwright.dev/rollout"  # a hash of the rollout id (label values are at most 63 chars)
JOB_INTERRUPT_LABEL = "millwright.dev/interrupt"
JOB_ROLLOUT_ANNOTATION = "millwright.dev/rollout-id"
JOB_VERSION_ANNOTATION = "millwright.dev/version"
JOB_ATTEMPT_ANNOTATION = "millwright.dev/attempt"
JOB_TRY_ANNOTATION = "millwright.dev/try"
INTERRUPTS = ("reboot", "service", "restartAllServices", "noop")


class Stage(StrEnum):
    """A stage of a package on a node, by NodeWright's name (each runs as a Job); `STAGE_TRAITS` says what it is."""

    APPLY = "apply"
    UPGRADE = "upgrade"
    CONFIG = "config"
    INTERRUPT = "interrupt"
    POST_INTERRUPT = "post-interrupt"
    UNINSTALL = "uninstall"
    UNINSTALL_INTERRUPT = "uninstall-interrupt"
    VALIDATE = "validate"

    @classmethod
    def named(cls, name: str) -> Stage | None:
        """The stage of that name; None for a name no stage has (a request to refuse)."""
        return cls._value2member_map_.get(name)  # type: ignore[return-value]

    @property
    def is_interrupt(self) -> bool:
        """It runs the package's interrupt (a reboot, services restarted): the node is out of service for it."""
        return STAGE_TRAITS[self].interrupt

    @property
    def checked(self) -> bool:
        """Its Job runs the stage's work, then its `<stage>-check` container (NodeWright's order)."""
        return STAGE_TRAITS[self].checked

    def needs_reboot(self, interrupt: str | None) -> bool:
        """The node reboots in this stage, given the interrupt it runs: its boot ID must change."""
        return self.is_interrupt and interrupt == "reboot"

    @property
    def event_reason(self) -> str:
        """The reason of the node Events it writes (NodeWright's vocabulary)."""
        return "Interrupt" if self.is_interrupt else "Apply"


class StageTraits(NamedTuple):
    interrupt: bool
    checked: bool  # an interrupt checks itself by the node coming back; a validation is a check


STAGE_TRAITS = {
    Stage.APPLY: StageTraits(interrupt=False, checked=True),
    Stage.UPGRADE: StageTraits(interrupt=False, checked=True),
    Stage.CONFIG: StageTraits(interrupt=False, checked=True),
    Stage.INTERRUPT: StageTraits(interrupt=True, checked=False),
    Stage.POST_INTERRUPT: StageTraits(interrupt=False, checked=True),
    Stage.UNINSTALL: StageTraits(interrupt=False, checked=True),
    Stage.UNINSTALL_INTERRUPT: StageTraits(interrupt=True, checked=False),
    Stage.VALIDATE: StageTraits(interrupt=False, checked=False),
}


# ---------------------------------------------------------------- models


class DrainSettings(StrictModel):
    """How to drain, mirroring `kubectl drain` flags, with a finite default timeout."""

    ignore_daemonsets: bool = Field(True, description="Skip DaemonSet pods (kubectl --ignore-daemonsets).")
    delete_emptydir_data: bool = Field(
        False, description="Evict pods using emptyDir volumes; their data is lost (--delete-emptydir-data)."
    )
    force: bool = Field(False, description="Evict pods that no controller will recreate (--force).")
    grace_period_seconds: int | None = Field(
        None, ge=0, description="Override each pod's terminationGracePeriodSeconds; unset keeps the pod's own."
    )
    pod_selector: str | None = Field(None, description="Only drain pods matching this label selector.")
    gpu_pods_only: bool = Field(
        False, description="Only drain pods that use GPUs (`nvidia.com/gpu` or `nvidia.com/mig-*`); the rest stay."
    )
    timeout: timedelta = Field(
        timedelta(minutes=30), description="Give up the drain after this long (ISO 8601 duration or seconds)."
    )
    eviction_retry_interval: timedelta = Field(
        timedelta(seconds=5), description="Wait between eviction attempts blocked by a PodDisruptionBudget."
    )
    checkpoint_interval: timedelta = Field(
        DEFAULT_CHECKPOINT_INTERVAL,
        description="How often the GPU work on the node checkpoints: a gang the drain interrupts loses at most this "
        "much of its run (gpu_hours_at_risk: its GPUs x the time since it started, capped by this).",
    )

    _selector = field_validator("pod_selector")(validate_label_selector)
    _durations = field_validator("timeout", "eviction_retry_interval", "checkpoint_interval")(
        validate_positive_duration
    )


class NodeRef(StrictModel):
    cluster: str
    node: str


class NodeInfo(StrictModel):
    name: str
    unschedulable: bool
    cordoned_by: str | None = None
    ready: bool
    boot_id: str | None = None
    system_uuid: str = Field("", description="status.nodeInfo.systemUUID: the machine's SMBIOS UUID.")
    packages: dict[str, str] = Field(default_factory=dict, description="From the packages annotation.")
    rollout_state: str | None = Field(None, description="The rollout-state label.")


class CordonRequest(StrictModel):
    cluster: str
    node: str
    owner: str = Field(description="Who holds the cordon: the workflow ID.")
    reason: str = ""


class CordonResult(StrictModel):
    owned: bool = Field(description="True when this owner placed (or already held) the cordon.")
    holder: str | None = Field(None, description="Who placed the cordon when it is not ours ('unknown' if unmarked).")


class CordonHandOver(CordonRequest):
    """`owner` passes its cordon to `to` (another run's workflow ID), with `reason`: the node never schedulable
    between the two."""

    to: str = Field(min_length=1, description="The workflow ID that holds the cordon after.")


class UncordonResult(StrictModel):
    uncordoned: bool
    note: str


class PodRef(StrictModel):
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodQuery(StrictModel):
    cluster: str
    node: str
    label_selector: str


class DrainPlanRequest(StrictModel):
    cluster: str
    node: str
    settings: DrainSettings


class SkippedPod(StrictModel):
    pod: PodRef
    reason: str


class DrainPlan(StrictModel):
    evict: list[PodRef] = Field(default_factory=list)
    skipped: list[SkippedPod] = Field(default_factory=list)
    gangs: list[Gang] = Field(
        default_factory=list, description="The gangs of GPU work the pods to evict belong to, as read with the plan."
    )
    pod_gangs: dict[str, str] = Field(
        default_factory=dict, description="Pod to evict ('namespace/name') -> the id of its gang in `gangs`."
    )


class EvictRequest(StrictModel):
    cluster: str
    pod: PodRef
    grace_period_seconds: int | None = None
    node: str = Field(
        "", description="The node drained: its DrainBlocked condition True while the eviction is refused."
    )
    was_blocked: bool = Field(
        False,
        description="An earlier eviction of the pod was refused: once this one is "
        "accepted, DrainBlocked goes False if it still names the pod.",
    )


class EvictOutcome(StrictModel):
    status: Literal["evicted", "gone", "blocked"]
    message: str = ""
    budget: str | None = Field(None, description="The PodDisruptionBudget blocking the eviction, when known.")
    retry_after_seconds: float | None = None


class WaitPodsGoneRequest(StrictModel):
    cluster: str
    pods: list[PodRef]
    poll_interval_seconds: float = 1.0
    node: str = Field("", description="The node drained: DrainBlocked while a pod outlives its grace period, "
                                      "cleared once all are gone.")  # fmt: skip
    not_leaving_after_seconds: float = Field(30.0, ge=0, description="How long past its grace period a terminating "
                                             "pod may stay before the drain shows as blocked.")  # fmt: skip
    was_blocked: bool = Field(False, description="The drain was shown blocked: DrainBlocked goes False once all "
                                                 "the pods are gone.")  # fmt: skip


class NodePageRequest(StrictModel):
    cluster: str
    label_selector: str = ""
    label_keys: list[str] = Field(default_factory=list, description="Labels to return; empty returns all.")
    limit: int = Field(1000, ge=1)
    continue_token: str | None = None

    _selector = field_validator("label_selector")(validate_label_selector)


class NodeSummary(StrictModel):
    name: str
    labels: dict[str, str]
    unschedulable: bool
    cordoned_by: str | None = Field(None, description=f"Who holds its cordon ({CORDONED_BY}), when anyone marked it.")
    ready: bool
    created: str | None = Field(
        None, description="metadata.creationTimestamp (RFC 3339, UTC): a rollout's stable order."
    )


class NodePage(StrictModel):
    nodes: list[NodeSummary]
    continue_token: str | None = None


class UnavailableRequest(StrictModel):
    cluster: str
    label_selector: str = ""
    topology: TopologyLabels | None = Field(
        None,
        description="Set (a disruption budget with NVLink-domain or gang limits): answer where each node out of "
        "service and each of `nodes` sits, by these label keys.",
    )
    nodes: list[str] = Field(
        default_factory=list, description="With `topology`: the nodes besides those out of service to place."
    )
    gangs: bool = Field(
        False, description="With `topology`: also the gangs on those nodes, and the cluster's gangs disrupted."
    )

    _selector = field_validator("label_selector")(validate_label_selector)


class NodeAvailability(StrictModel):
    total: int = Field(description="Nodes the selector matches.")
    unavailable: dict[str, str] = Field(
        default_factory=dict, description="Node -> why it is out of service: 'cordoned' and/or 'NotReady', name order."
    )
    read_at: datetime | None = Field(
        None,
        description="When the read finished (the worker's clock): the time a decision on it is made at, "
        "recorded with the result so that a replay decides at the same time.",
    )
    control_plane: list[str] = Field(
        default_factory=list,
        description="Every matched node labelled node-role.kubernetes.io/control-plane, in service or not.",
    )
    places: dict[str, NodePlace] = Field(
        default_factory=dict,
        description="Asked with `topology`: where each node out of service and each node asked about sits.",
    )
    gangs_on: dict[str, list[str]] = Field(
        default_factory=dict, description="Asked with `gangs`: those nodes' gangs of GPU work (gang ids), by node."
    )
    disrupted_gangs: dict[str, str] = Field(
        default_factory=dict,
        description="Asked with `gangs`: gang id -> why it is disrupted (below its minimum, or pods on a node "
        "out of service), the whole cluster's.",
    )


class NodeRolloutState(StrictModel):
    cluster: str
    node: str
    rollout: str
    state: str
    package: str | None = None
    stage: str | None = None
    reason: str = ""


class NodeValidationMark(StrictModel):
    """A validation's verdict to show on the node (workflows/validation/gate.py)."""

    cluster: str
    node: str
    by: str = Field(description="The workflow that validated the node: in the Event's name, so a retry adds none.")
    passed: bool
    reason: str = Field("", description="What failed; empty when it passed.")


# The cluster's validation default (docs/validation.md): the settings, as YAML or JSON, under this key of this
# ConfigMap in JOB_NAMESPACE.
VALIDATION_DEFAULT_CONFIGMAP = "millwright-validation"
VALIDATION_DEFAULT_KEY = "validation"


class ClusterDefaultRequest(StrictModel):
    cluster: str


class ClusterDefault(StrictModel):
    """What the cluster's ConfigMap holds, parsed but not yet judged (the workflow judges it with its model)."""

    source: str = Field(description="Where it was read: 'ConfigMap <namespace>/<name> in <cluster>'.")
    found: bool = Field(description="False: no such ConfigMap (no default).")
    settings: dict[str, Any] | None = Field(None, description="The key's document; None when not found.")


class StageJobRequest(NodeStage):
    cluster: str
    node: str
    rollout: str = Field(description="The rollout workflow id: in the Job's name hash and labels.")
    ordinal: int = Field(0, description="The node's order in the rollout (MILLWRIGHT_NODE_ORDER).")
    try_number: int = Field(1, ge=1, description="The workflow's own try of this stage (a new try: a new Job).")


class StageJobResult(StrictModel):
    job: str
    succeeded: bool
    message: str = ""
    attempt: int


class RebootWait(StrictModel):
    cluster: str
    node: str
    previous_boot_id: str
    timeout_seconds: float = 1800
    poll_seconds: float = 2.0


class StageRecord(StrictModel):
    """One stage of a package run on a node: its verdict after the tries it took."""

    package: str
    stage: str
    succeeded: bool
    attempts: int
    message: str = ""


class NodeUpdateStart(StrictModel):
    cluster: str
    node: str
    rollout: str = Field(description="The rollout's workflow ID: owner of the cordon, named in the node's state.")
    cordon: bool = Field(
        description="Take the node out of service first (an interrupt is due): cordon, plan the drain."
    )
    non_interrupt_selector: str | None = Field(
        None, description="Pods that must finish before the node is cordoned; while one runs, the node is blocked."
    )
    drain: DrainSettings | None = Field(None, description="How the drain is planned (with cordon).")
    packages: dict[str, str] = Field(default_factory=dict, description="Package -> version the rollout installs: "
                                     "a node with a later version installed is refused, untouched.")  # fmt: skip
    allow_downgrade: bool = Field(False, description="Install `packages` over later versions.")
    auto_taint: bool = Field(
        False,
        description="Give a new node (no Millwright annotation) the runtime-required "
        "taint first, so it takes no work until its packages are complete.",
    )

    _selector = field_validator("non_interrupt_selector")(validate_label_selector)


class NodeUpdateStarted(StrictModel):
    node: NodeInfo = Field(description="The node as the update found it: its packages and boot ID.")
    blocked: str = Field("", description="Why the node was left in service (non-interruptible pods run); empty: "
                                         "started.")  # fmt: skip
    cordon: CordonResult | None = Field(None, description="With cordon: whose cordon the node has.")
    drain: DrainPlan | None = Field(None, description="With cordon: the pods to evict, listed after the cordon.")
    refused: str = Field("", description="Why the node was left untouched but `erroring` (a downgrade not allowed).")


class NodeUpdateFinish(StrictModel):
    cluster: str
    node: str
    rollout: str
    packages: dict[str, str] = Field(default_factory=dict, description="Package -> version now installed.")
    removed: list[str] = Field(default_factory=list, description="Packages uninstalled: their entries go.")
    uncordon: bool = Field(description="Remove the rollout's own cordon (never one someone else placed).")
    untaint: bool = Field(False, description="Remove the runtime-required taint: the node's packages are complete.")


class NodeStages(StrictModel):
    """Stages to run on one node, in order, each as its Job (NodeWright's node sequence after the drain)."""

    cluster: str
    node: str
    rollout: str
    ordinal: int = 0
    stages: list[NodeStage] = Field(default_factory=list, description="The stages; with `start`, made by `plan` "
                                    "from the packages the start finds on the node instead.")  # fmt: skip
    tries: int = Field(1, ge=1, description="Jobs a stage may take: a failed one is tried again, as a new Job.")
    boot_id: str = Field("", description="The node's boot ID before the stages: a reboot must change it.")
    reboot_timeout_seconds: float = Field(1800, gt=0, description="How long a rebooted node may take to be back.")
    reboot_poll_seconds: float = 2.0
    finish: NodeUpdateFinish | None = Field(None, description="Once every stage has succeeded, hand the node back "
                                            "(finish_node_update's one write) before returning; with `start`, its "
                                            "packages and removed ones are those `plan` makes.")  # fmt: skip
    start: NodeUpdateStart | None = Field(None, description="Begin the node's update first, as start_node_update "
                                          "does; when it leaves nothing to drain, go on with the stages `plan` makes "
                                          "from the packages it found, else return after it.")  # fmt: skip
    plan: NodePlan | None = Field(None, description="With `start`: the rollout's packages, for the node's stages.")

    @model_validator(mode="after")
    def _finish_is_this_nodes(self) -> NodeStages:
        for name, part in (("finish", self.finish), ("start", self.start)):
            if part is not None and (part.cluster, part.node, part.rollout) != (self.cluster, self.node, self.rollout):
                raise ValueError(f"{name}: names another cluster, node or rollout than the stages'")
        if (self.start is None) == (self.plan is None):
            if self.start is None and not self.stages:
                raise ValueError("stages: at least one, or a start and its plan")
            if self.start is not None and self.stages:
                raise ValueError("stages: none with a start (its plan makes them)")
        else:
            raise ValueError("start and plan: both or neither")
        return self


class NodeStagesResult(StrictModel):
    stages: list[StageRecord] = Field(description="The stages run, in order; a failed one is the last.")
    held: bool = Field(False, description="It stopped before the next stage because its workflow asked (a pause).")
    reboot_seconds: float | None = Field(None, description="From the reboot Job's start to the node back, new boot ID.")
    finished: bool = Field(False, description="The node was handed back (the request's `finish` written).")
    started: NodeUpdateStarted | None = Field(None, description="With `start`: what it found and did; the stages "
                                              "ran only when it was started with nothing to drain.")  # fmt: skip


class ConditionGate(StrictModel):
    cluster: str
    label_selector: str = ""
    conditions: list[str] = Field(description="Node condition types that must not be True; 'Ready' must be True.")

    _selector = field_validator("label_selector")(validate_label_selector)
