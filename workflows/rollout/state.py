"""What a rollout remembers: carried across continue-as-new inside its input.

Kept apart from the policy arithmetic so the input model can carry it without an
import cycle. Compact on purpose: a rollout over 10,000 nodes carries one short state
code per node.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from activities.models import StrictModel
from workflows.maintenance.drain import DrainCost

# A node's place in the rollout, NodeWright's vocabulary.
NodeStatus = Literal["waiting", "in_progress", "complete", "erroring", "blocked", "skipped"]


class _State(StrictModel):
    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True)


class BatchState(_State):
    """NodeWright's `BatchProcessingState`, one per compartment.

    `completed_nodes` and `failed_nodes` are cumulative; `should_stop` stays set until
    the state is reset (`BatchState()`).
    """

    current_batch: int = 1
    consecutive_failures: int = 0
    completed_nodes: int = 0
    failed_nodes: int = 0
    should_stop: bool = False
    last_batch_size: int = 0
    last_batch_failed: bool = False


class CompartmentState(_State):
    members: list[str] = Field(default_factory=list)
    batch: BatchState = Field(default_factory=BatchState)
    completed: bool = Field(
        False,
        description="Every member complete; nodes joining later start from a reset batch state if the "
        "policy resets on completion.",
    )


class RolloutCheckpoint(_State):
    """Everything a continued run needs; absent on the first run."""

    compartments: dict[str, CompartmentState] = Field(default_factory=dict)
    nodes: dict[str, NodeStatus] = Field(default_factory=dict)
    reasons: dict[str, str] = Field(default_factory=dict, description="Why a node is erroring, blocked or skipped.")
    next_ordinal: int = 0
    approved_compartments: list[str] = Field(default_factory=list)
    paused_reason: str | None = None
    runs: int = 1
    # Batch planning (workflows/rollout/membership.py); empty in checkpoints from before it.
    retries: dict[str, int] = Field(default_factory=dict, description="Erroring node -> automatic retries it had.")
    joined: dict[str, str] = Field(
        default_factory=dict, description="Node that started matching mid-rollout -> the compartment it joined."
    )
    left: dict[str, NodeStatus] = Field(
        default_factory=dict, description="Node that stopped matching mid-rollout -> its state when it left."
    )
    cost: DrainCost = Field(
        default_factory=DrainCost, description="What the run's drains cost the GPU work so far, its nodes summed."
    )
    package_versions: dict[str, str] = Field(
        default_factory=dict, description="The versions the batch states were built under (a change resets them)."
    )
