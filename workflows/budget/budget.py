"""A disruption budget: how many of a cluster's nodes may be out of service at once, and its ceiling over a count.

Rollouts (per compartment), node maintenance, remediation and burn-in all take one; the cluster's DisruptionBudget
entity (workflows/budget/disruption_budget.py) holds the leases it allows. Its fields are one word each, so the
rollout spec's camelCase JSON and Python's names agree."""

from __future__ import annotations

from pydantic import Field, model_validator

from activities.models import StrictModel


class Budget(StrictModel):
    """Exactly one of `percent` (1-100, floored, minimum 1) or `count` (≥1).

    In Millwright the budget is a hard cap on nodes out of service at once, counting
    nodes unavailable for any reason (NodeWright ignores it once a strategy is set).
    """

    percent: int | None = Field(None, ge=1, le=100)
    count: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> Budget:
        if (self.percent is None) == (self.count is None):
            raise ValueError("set exactly one of percent or count")
        return self


def ceiling(budget: Budget, matched: int) -> int:
    """NodeWright's `CalculateCeiling`: `count`, or `max(1, floor(matched * percent / 100))`;
    0 for a percent budget over no nodes. Exact integer arithmetic (DEPARTURE 3 of workflows/rollout/batching.py)."""
    if budget.count is not None:
        return budget.count
    assert budget.percent is not None
    if matched <= 0:
        return 0
    return max(1, matched * budget.percent // 100)
