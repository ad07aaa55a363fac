"""The models of a campaign across clusters (issue #42): what `FleetRollout` and `FleetGpuPartitioning` take,
return and show.

Pure data, as workflows/rollout/models.py: the worker passes it through the sandbox once (worker/registry.py).
Strict at every depth like every other input: an unknown field anywhere is refused with its path.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal, TypeVar

from pydantic import Field, field_validator, model_validator
from temporalio.common import SearchAttributePair

from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput
from workflows.partitioning.models import GpuPartitioningInput, GpuPartitioningSpec
from workflows.rollout.spec.spec import RolloutInput, RolloutSpec
from workflows.rollout.spec.spec_fields import Duration

MAX_CLUSTERS = 200
I = TypeVar("I", bound=WorkflowInput)


class WavePlan(StrictModel):
    """How fast a campaign goes: the canary cluster alone, then waves of `wave_size` in the input's order."""

    canary: str | None = Field(None, description="One of `clusters`, run alone first; default the first of them.")
    wave_size: int = Field(1, ge=1, description="Clusters started at once after the canary.")
    soak: Duration = Field(
        timedelta(0), description="After the canary and after each wave ends, before the next starts (a timer)."
    )
    max_failed_clusters: int = Field(
        0, ge=0, description="Once more clusters than this have failed, no further cluster starts (running ones "
        "finish) and the campaign ends `failed`.",
    )  # fmt: skip
    approve_after_canary: bool = Field(False, description="Wait for the `approve` control after the canary's soak.")

    @field_validator("soak")
    @classmethod
    def _soak(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("must not be negative")
        return value

    def waves(self, clusters: list[str]) -> list[list[str]]:
        """The canary alone, then the others in their order, `wave_size` at a time."""
        canary = self.canary or clusters[0]
        rest = [c for c in clusters if c != canary]
        return [[canary]] + [rest[i : i + self.wave_size] for i in range(0, len(rest), self.wave_size)]


def for_cluster(spec: StrictModel, input_type: type[I], cluster: str) -> I:
    """A child's input: the campaign's spec for every cluster, with this one's name, validated as the child's."""
    return input_type.model_validate(spec.model_dump(by_alias=False) | {"cluster": cluster})


class RolloutTemplate(RolloutSpec):
    """A Rollout's input without `cluster`: every cluster of the campaign gets the same, validated the same way."""

    def for_cluster(self, cluster: str) -> RolloutInput:
        return for_cluster(self, RolloutInput, cluster)


class GpuPartitioningTemplate(GpuPartitioningSpec):
    """A GpuPartitioning's input without `cluster`: every cluster of the campaign gets the same."""

    def for_cluster(self, cluster: str) -> GpuPartitioningInput:
        return for_cluster(self, GpuPartitioningInput, cluster)


class CampaignInput(WorkflowInput):
    """What every campaign takes: its name, its clusters in order and how fast it goes through them."""

    name: str = Field(min_length=1, max_length=63, description="Names the campaign (and its workflow ID).")
    clusters: list[str] = Field(min_length=1, max_length=MAX_CLUSTERS, description="Kubeconfig contexts, in order.")
    plan: WavePlan = Field(default_factory=WavePlan)

    _name = field_validator("name")(validate_object_name)

    @field_validator("clusters")
    @classmethod
    def _clusters(cls, value: list[str]) -> list[str]:
        seen: dict[str, int] = {}
        for i, cluster in enumerate(value):
            validate_object_name(cluster)
            if cluster in seen:
                raise ValueError(f"{cluster!r} is listed twice (at {seen[cluster]} and {i})")
            seen[cluster] = i
        return value

    @model_validator(mode="after")
    def _canary_is_a_cluster(self) -> CampaignInput:
        if self.plan.canary is not None and self.plan.canary not in self.clusters:
            raise ValueError(f"plan.canary: {self.plan.canary!r} is not one of clusters {self.clusters}")
        return self

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.PHASE, "pending")]


class FleetRolloutInput(CampaignInput):
    """One rollout across clusters: a canary cluster, then waves, each cluster a `Rollout` under its own budget
    (workflow ID `fleet-rollout/<name>`)."""

    rollout: RolloutTemplate = Field(description="Each cluster's Rollout input, but its cluster.")

    def workflow_id(self) -> str:
        return f"fleet-rollout/{self.name}"


class FleetGpuPartitioningInput(CampaignInput):
    """One MIG layout across clusters: a canary cluster, then waves, each cluster a `GpuPartitioning` under its own
    budget (workflow ID `fleet-gpu-partitioning/<name>`)."""

    partitioning: GpuPartitioningTemplate = Field(description="Each cluster's GpuPartitioning input, but its cluster.")

    def workflow_id(self) -> str:
        return f"fleet-gpu-partitioning/{self.name}"


ClusterState = Literal["pending", "running", "completed", "failed", "aborted", "skipped"]


class ClusterOutcome(StrictModel):
    """One cluster of a campaign: where its child run stands, and how it ended."""

    state: ClusterState = "pending"
    wave: int = Field(0, description="0: the canary; then the wave it runs in.")
    workflow_id: str = Field("", description="The child run's workflow ID, once started.")
    counts: dict[str, int] = Field(default_factory=dict, description="The child's node counts by state, once ended.")
    error: str = Field("", description="Why it failed, was aborted or skipped.")
    started: datetime | None = None
    ended: datetime | None = None


CampaignOutcome = Literal["completed", "failed", "aborted"]


class CampaignResult(StrictModel):
    name: str
    outcome: CampaignOutcome
    clusters: dict[str, ClusterOutcome]
    waves: list[list[str]]


class CampaignStatus(StrictModel):
    """The `status` query: what the campaign waits for and every cluster's state (`progress` is the short form)."""

    phase: str
    waiting_for: str = Field("", description="Soak until when, approval, a pause (by whom), a wave's clusters.")
    wave: int = Field(-1, description="The wave under way or last run (0: the canary); -1 before the canary.")
    waves: list[list[str]]
    paused: str | None = Field(None, description="Why and by whom, while paused.")
    aborted: str | None = None
    awaiting_approval: bool = Field(False, description="Waiting for `approve` after the canary (paused or not).")
    approved_by: str | None = None
    failed: int = Field(0, description="Clusters that failed (or were aborted by someone else) so far.")
    max_failed_clusters: int = 0
    clusters: dict[str, ClusterOutcome] = Field(default_factory=dict)


class ApproveRequest(StrictModel):
    """`approve`: the waves after the canary may start."""

    approver: str = Field(min_length=1)
    reason: str = ""
