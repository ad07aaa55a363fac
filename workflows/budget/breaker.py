"""A cluster's remediation circuit breaker: the book the ``DisruptionBudget`` entity keeps of the nodes automated
remediation took out of service, and when it trips.

The entity sees every node going out of service (workflows/budget/disruption_budget.py), so it holds the breaker: a lease
asked for by a remediation (``LeaseRequest.remediation`` set; NodeRemediation sets it, nothing else does) is
recorded here when granted. A remediation that would take more than ``max_percent`` of the cluster's nodes out of
service within ``window`` (counting each node once, those already back in service too) trips the breaker instead
of being granted; from then on every remediation's request is refused, at once and with the reason, until an
operator's ``reset_breaker`` update (NVSentinel's breaker: 50 % in 5 minutes, and it never resets by itself).
Rollouts, maintenance and burn-in never trip it and are never refused by it.

Each remediation is judged with the settings it carries (a sweep passes its own to the NodeRemediations it starts),
against the one record of the cluster. Pure bookkeeping: no I/O, the caller passes `now`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import Field, field_validator

from activities.kube.validators import validate_positive_duration
from activities.models import StrictModel
from workflows.common.durations import human_duration

BREAKER_PATCH = "disruption-budget-breaker"  # workflow.patched() id: the entity keeps a breaker
BREAKER_QUERY = "breaker"
RESET_UPDATE = "reset_breaker"
TRIPPED_PHASE = "breaker-tripped"  # the entity's MillwrightPhase while tripped, else SERVING_PHASE
SERVING_PHASE = "serving"
TRIPPED_GAUGE = "millwright_remediation_breaker_tripped"
TRIPS_COUNTER = "millwright_remediation_breaker_trips"


class BreakerSettings(StrictModel):
    """When a cluster's remediation circuit breaker trips (NVSentinel's defaults)."""

    max_percent: int = Field(50, ge=1, le=100, description="Trip when remediation would take more than this share "
                             "of the cluster's nodes out of service within `window`; 100: never.")  # fmt: skip
    window: timedelta = Field(timedelta(minutes=5), description="How far back the nodes remediation took count.")

    _window = field_validator("window")(validate_positive_duration)


class TakenNode(StrictModel):
    node: str
    holder: str
    at: datetime
    window: timedelta = Field(description="The window it was taken under: it counts (and is kept) that long.")


class BreakerReset(StrictModel):
    """The ``reset_breaker`` update: an operator resumes automated remediation on the cluster."""

    by: str = Field(min_length=1, description="Who resets it.")
    reason: str = Field(min_length=1, max_length=1024, description="Why (what was found and fixed); recorded.")


class Breaker(StrictModel):
    """The breaker's state, carried across continue-as-new in the entity's book."""

    tripped: bool = False
    tripped_at: datetime | None = None
    reason: str = Field("", description="Why it tripped.")
    trips: int = Field(0, description="Times it tripped, in this entity's life.")
    refused: int = Field(0, description="Remediations refused since it last tripped.")
    taken: list[TakenNode] = Field(default_factory=list, description="Nodes remediation took, within their windows.")
    reset: str = Field("", description="The last reset: when, by whom, why.")

    def admit(self, node: str, holder: str, total: int, settings: BreakerSettings, now: datetime) -> str | None:
        """Record a remediation taking `node` out of service; or, when tripped or when it would trip the breaker,
        refuse it: the reason. `total`: the cluster's nodes at the read the decision is made on."""
        return self.admit_all([node], holder, total, settings, now)

    def admit_all(
        self, nodes: list[str], holder: str, total: int, settings: BreakerSettings, now: datetime
    ) -> str | None:
        """`admit` for a remediation that takes `nodes` out of service together (a group of leases): one decision,
        every node recorded or none, and a refusal counted once."""
        if self.tripped:
            self.refused += 1
            return self.refusal()
        self.taken = [t for t in self.taken if now - t.at < t.window]
        recent = {t.node for t in self.taken if now - t.at < settings.window}
        new = [node for node in dict.fromkeys(nodes) if node not in recent]
        if new and total > 0 and (len(recent) + len(new)) * 100 > settings.max_percent * total:
            self.tripped, self.tripped_at, self.trips, self.refused = True, now, self.trips + 1, 1
            self.reason = (f"remediation took {len(recent)} of {total} nodes out of service within "
                           f"{human_duration(settings.window)}; {', '.join(new)} too would be more than "
                           f"{settings.max_percent}%")  # fmt: skip
            return self.refusal()
        self.taken += [TakenNode(node=node, holder=holder, at=now, window=settings.window)
                       for node in dict.fromkeys(nodes)]  # fmt: skip
        return None

    def clear(self, reset: BreakerReset, now: datetime) -> None:
        """Close the breaker and forget what remediation took (else the next request would trip it again)."""
        self.tripped, self.tripped_at, self.refused, self.taken = False, None, 0, []
        self.reset = f"{now.isoformat()} by {reset.by}: {reset.reason}"

    def refusal(self) -> str:
        return refusal(self.tripped_at, self.reason)


class BreakerView(StrictModel):
    """The ``breaker`` query."""

    cluster: str
    enabled: bool = Field(description="False on an entity run from before the breaker (it has none).")
    tripped: bool
    tripped_at: datetime | None = None
    reason: str = ""
    trips: int = 0
    refused: int = 0
    taken: list[TakenNode] = Field(default_factory=list)
    reset: str = ""

    def line(self) -> str:
        return f"{self.cluster}: " + (refusal(self.tripped_at, self.reason) if self.tripped else
                                      "remediation circuit breaker closed")  # fmt: skip


def refusal(tripped_at: datetime | None, reason: str) -> str:
    at = tripped_at.isoformat() if tripped_at else "?"
    return f"remediation circuit breaker tripped at {at}: {reason}; an operator's `{RESET_UPDATE}` resumes remediation"
