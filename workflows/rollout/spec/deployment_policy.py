"""The rollout spec's `deploymentPolicy`: compartments (a selector, a budget, a strategy each), the default for
nodes matching none, and this rollout's overrides of the policy's settings.

The arithmetic that applies it is workflows/rollout/batching.py. Pure: stdlib + pydantic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from activities.support.selectors import Requirement
from workflows.budget.budget import Budget
from workflows.rollout.spec.label_selector import LabelSelector
from workflows.rollout.spec.spec_fields import SpecModel

DEFAULT_COMPARTMENT = "__default__"


class _StrategyParams(SpecModel):
    initial_batch: int = Field(1, ge=1)
    batch_threshold: int = Field(100, ge=1, le=100, description="% of a batch's non-blocked nodes that must succeed.")
    failure_threshold: int | None = Field(
        None, ge=1, description="Consecutive failed batches that stop the compartment."
    )
    safety_limit: int = Field(
        100,
        ge=1,
        le=100,
        description="Failures stop the compartment only while progress is below this %. "
        "Millwright's default is 100 (always); NodeWright's is 50.",
    )


class FixedStrategy(_StrategyParams):
    pass


class LinearStrategy(_StrategyParams):
    delta: int = Field(1, ge=1)


class ExponentialStrategy(_StrategyParams):
    growth_factor: int = Field(2, ge=2)


StrategyKind = Literal["fixed", "linear", "exponential"]


class Strategy(SpecModel):
    """Exactly one of `fixed`, `linear`, `exponential`."""

    fixed: FixedStrategy | None = None
    linear: LinearStrategy | None = None
    exponential: ExponentialStrategy | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Strategy:
        n = sum(s is not None for s in (self.fixed, self.linear, self.exponential))
        if n != 1:
            raise ValueError("set exactly one of fixed, linear or exponential")
        return self

    @property
    def kind(self) -> StrategyKind:
        return "fixed" if self.fixed else "linear" if self.linear else "exponential"

    @property
    def params(self) -> FixedStrategy | LinearStrategy | ExponentialStrategy:
        return self.fixed or self.linear or self.exponential  # type: ignore[return-value]


class PolicyDefault(SpecModel):
    """Budget and strategy for nodes matching no compartment (`__default__`)."""

    budget: Budget
    strategy: Strategy


class Compartment(SpecModel):
    name: str = Field(min_length=1, max_length=63)
    selector: LabelSelector
    budget: Budget
    strategy: Strategy | None = Field(
        None, description="Without one, each batch is the budget's ceiling (NodeWright's rule)."
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == DEFAULT_COMPARTMENT:
            raise ValueError(f"{DEFAULT_COMPARTMENT!r} is reserved for nodes matching no compartment")
        return value

    @field_validator("selector")
    @classmethod
    def _not_empty(cls, value: LabelSelector) -> LabelSelector:
        if value.is_empty():
            raise ValueError("an empty selector matches every node; use deploymentPolicy.default instead")
        return value


def _safe_default() -> PolicyDefault:
    return PolicyDefault(budget=Budget(count=1), strategy=Strategy(fixed=FixedStrategy()))


class DeploymentPolicy(SpecModel):
    """NodeWright's DeploymentPolicy spec, inline. Defaults to one node at a time."""

    default: PolicyDefault = Field(default_factory=_safe_default)
    compartments: list[Compartment] = Field(default_factory=list)
    reset_batch_state_on_completion: bool = Field(
        True,
        description="NodeWright's policy setting: a compartment's batch state goes back to batch 1 when all its "
        "nodes are done (nodes joining later start small again) and when the package versions change; false keeps it.",
    )
    retry_erroring_nodes: int = Field(
        1,
        ge=0,
        le=10,
        description="How many times a node that ended erroring is put in a later batch again "
        "automatically (0: never; retry_node still can). Each retry counts against the budget and the stop rule.",
    )

    @field_validator("compartments")
    @classmethod
    def _distinct(cls, value: list[Compartment]) -> list[Compartment]:
        names: dict[str, int] = {}
        selectors: dict[tuple[Requirement, ...], int] = {}
        for i, c in enumerate(value):
            if c.name in names:
                raise ValueError(f"{i}.name: {c.name!r} is already the name of compartment {names[c.name]}")
            names[c.name] = i
            key = c.selector.canonical()
            if key in selectors:
                raise ValueError(f"{i}.selector: identical to the selector of compartment {selectors[key]}")
            selectors[key] = i
        return value


class DeploymentPolicyOptions(SpecModel):
    """NodeWright's `deploymentPolicyOptions`: this rollout's overrides of its policy's settings."""

    reset_batch_state_on_completion: bool | None = Field(
        None, description="Overrides deploymentPolicy.resetBatchStateOnCompletion for this rollout when set."
    )
