"""FleetHealthSweep's input, cursor, slices and result (workflows/remediation/health_sweep.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from temporalio.common import SearchAttributePair

from activities.kube.topology import NodePlace
from activities.kube.validators import validate_label_selector, validate_positive_duration
from activities.models import StrictModel
from activities.redfish import BmcRef
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput
from workflows.common.endpoints import RetryTimeout
from workflows.remediation.escalation import RackEscalation, RackTally
from workflows.remediation.models import DeviceFacts, RemediationSettings
from workflows.remediation.policy import DEFAULT_COOLDOWN, HealthChecks, MinHealthy, NodeDecision, validate_cooldown

HELD = 250  # nodes to remediate a sweep holds until their cluster is decided: one cluster's starts ≤ 2,250 events
LISTED = 500  # unhealthy nodes and remediations a result lists (the counts stay exact): results stay small


class StartedRemediation(StrictModel):
    cluster: str
    node: str
    workflow_id: str = Field(description="The node's NodeRemediation; escalated: its domain's RackRemediation.")
    reasons: list[str]
    status: Literal["started", "already-running", "deferred", "dry-run", "error", "refused", "escalated"]
    detail: str = ""


class ClusterSweep(StrictModel):
    cluster: str
    nodes: int = Field(0, description="Nodes listed (and given to slices).")
    healthy: int = 0
    not_healthy: int = Field(0, description="Nodes not healthy: to remediate, or skipped with why.")
    unhealthy: list[NodeDecision] = Field(default_factory=list, description=f"The nodes not healthy, with why (the "
                                          f"first {LISTED} of the sweep; `not_healthy` counts them all).")  # fmt: skip
    agents_unavailable: int = 0
    bmc_unknown: int = 0
    vanished: int = Field(0, description="Nodes deleted between the listing and their slice's read.")
    slices: int = Field(0, description="Slice children that swept this cluster's nodes.")
    refused: str | None = Field(None, description="Why no remediation was started in this cluster: too few healthy "
                                "nodes (min_healthy), or its circuit breaker tripped.")  # fmt: skip
    gpu_faults: int = Field(0, description="dcgm-exporter fault series above zero (any XID, ECC, row remap).")
    dcgm: str = Field("", description="Whether GPU faults were read from Prometheus, and from where; or why not.")
    error: str | None = None


class Candidate(StrictModel):
    """A node a slice found needing remediation, with what its NetBox device or `bmcs` say."""

    cluster: str
    decision: NodeDecision
    facts: DeviceFacts
    # With escalation: what the sweep decides the node's domain by (workflows/remediation/escalation.py).
    place: NodePlace | None = Field(None, description="Where the node sits.")
    fabric: list[str] = Field(default_factory=list, description="Its fabric signs but the clique label's.")
    seen_at: datetime | None = Field(None, description="When its slice read it.")


class FleetHealthSweepResult(StrictModel):
    clusters: list[ClusterSweep]
    remediations: list[StartedRemediation] = Field(
        default_factory=list, description=f"What was started, already running, deferred (the first {LISTED})."
    )
    remediation_counts: dict[str, int] = Field(default_factory=dict, description="Remediations by status, all.")
    found: list[Candidate] = Field(default_factory=list, description="A slice's nodes needing remediation, for the "
                                   "sweep that started it; empty in a sweep's own result.")  # fmt: skip
    racks: dict[str, RackTally] = Field(default_factory=dict, description="A slice's nodes counted per domain (rack "
                                        "key), with escalation; empty in a sweep's own result.")  # fmt: skip

    def started(self) -> list[StartedRemediation]:
        return [r for r in self.remediations if r.status == "started"]


class SweepSlice(StrictModel):
    """Nodes of one cluster that one child of a sweep owns."""

    cluster: str
    index: int = Field(ge=0)
    nodes: list[str] = Field(min_length=1, max_length=500)


class SliceRun(StrictModel):
    """A slice child the sweep started, as a later run of the sweep finds it again."""

    workflow_id: str
    run_id: str
    cluster: str
    index: int
    nodes: int
    first: str
    last: str


class SweepCursor(StrictModel):
    """Where a sweep stands, carried across continue-as-new."""

    cluster: int = Field(0, description="Index in `clusters` of the cluster being given out to slices.")
    after: str | None = Field(None, description="The last node (in name order) of that cluster given to a slice.")
    next_slice: int = 0
    running: list[SliceRun] = Field(default_factory=list)
    started: int = Field(0, description="Remediations started so far (max_remediations is per sweep).")
    held: list[Candidate] = Field(default_factory=list, description=f"Nodes to remediate in clusters not yet wholly "
                                  f"decided (at most {HELD}).")  # fmt: skip
    escalation: bool = Field(False, description="This sweep escalates whole domains (decided by its first run).")
    racks: dict[str, dict[str, RackTally]] = Field(default_factory=dict, description="Per cluster not yet wholly "
                                                   "decided, its nodes counted per domain (rack key).")  # fmt: skip
    result: FleetHealthSweepResult


class FleetHealthSweepInput(WorkflowInput, RetryTimeout):
    """Find the unhealthy nodes of some clusters and start a NodeRemediation for each (at most max_remediations)."""

    clusters: list[str] = Field(min_length=1, description="Cluster references (kubeconfig contexts).")
    label_selector: str = Field("", description="Only nodes matching this label selector.")
    checks: HealthChecks = Field(default_factory=HealthChecks)
    max_remediations: int = Field(1, ge=0, description="At most this many NodeRemediations started per sweep.")
    min_healthy: MinHealthy = Field(
        default_factory=lambda: MinHealthy(percent=51), description="Start no remediation in a cluster while fewer "
        "of the nodes swept are healthy (Node Healthcheck's minHealthy; percent 0: never refuse).")  # fmt: skip
    cooldown: timedelta = Field(DEFAULT_COOLDOWN, description="A node remediated less than this long ago (its "
                                "millwright.dev/last-remediation annotation) is skipped; 0: no cooldown.")  # fmt: skip
    netbox: bool = Field(False, description="Look BMCs and expected GPUs up in NetBox; children record quarantines.")
    netbox_role: str | None = Field("gpu-server", description="NetBox device role of the nodes (with netbox).")
    bmcs: dict[str, BmcRef] = Field(default_factory=dict, description="BMC per node name (before NetBox's).")
    agent_timeout: timedelta = Field(timedelta(seconds=10), description="No host agent picking up the GPU check "
                                     "within this long: unknown, not unhealthy.")  # fmt: skip
    concurrency: int = Field(20, ge=1, le=200, description="Nodes probed at once, across the running slices.")
    slice_size: int = Field(250, ge=1, le=500, description="Nodes per slice child (each run stays under ~3,000 "
                            "history events at 250).")  # fmt: skip
    slices_at_once: int = Field(2, ge=1, le=20, description="Slice children running at once; each probes "
                                "concurrency / slices_at_once nodes at once, so the next slice is busy while one "
                                "finishes its last probes.")  # fmt: skip
    remediation: RemediationSettings = Field(default_factory=RemediationSettings,
                                             description="How each started NodeRemediation works.")  # fmt: skip
    escalation: RackEscalation = Field(default_factory=RackEscalation, description="When a node's whole NVLink "
                                       "domain is remediated (one RackRemediation) instead of the node.")  # fmt: skip
    dry_run: bool = Field(False, description="Decide and report; start nothing.")
    # Set by the sweep itself; not for callers.
    part: SweepSlice | None = Field(None, description="Internal: the nodes a slice child sweeps.")
    carried: SweepCursor | None = Field(None, description="Internal: carried across continue-as-new.")

    _selector = field_validator("label_selector")(validate_label_selector)
    _timeout = field_validator("agent_timeout")(validate_positive_duration)

    _cooldown = field_validator("cooldown")(validate_cooldown)

    @model_validator(mode="before")
    @classmethod
    def _one_cluster(cls, data: Any) -> Any:
        """`{"cluster": "lab"}` is shorthand for `{"clusters": ["lab"]}`."""
        if isinstance(data, dict) and "cluster" in data and "clusters" not in data:
            data = {**data, "clusters": [data["cluster"]]}
            del data["cluster"]
        return data

    @field_validator("clusters")
    @classmethod
    def _names(cls, clusters: list[str]) -> list[str]:
        if len(set(clusters)) != len(clusters):
            raise ValueError("each cluster at most once")
        return clusters

    def workflow_id(self) -> str:
        return f"fleet-health-sweep/{'+'.join(self.clusters)}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.clusters[0])] if len(self.clusters) == 1 else []
