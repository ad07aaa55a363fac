"""When the rollout spec lets a batch start: maintenance windows and the gate checked before each batch.

workflows/rollout/batching.py decides whether a window is open. Pure: stdlib + pydantic.
"""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from activities.models import BaseUrl
from workflows.rollout.spec.spec_fields import WEEKDAYS, Duration, SpecModel, Weekday, zone


class MaintenanceWindow(SpecModel):
    """Nodes are admitted only inside a window: on `days`, from `startHour` to `endHour`
    local time in `timeZone`. `endHour` < `startHour` wraps past midnight (the day is
    the day the window opens); `endHour` 0 or 24 means midnight."""

    days: list[Weekday] = Field(default_factory=lambda: list(WEEKDAYS), min_length=1)
    start_hour: int = Field(ge=0, le=23)
    end_hour: int = Field(ge=0, le=24)
    time_zone: str = Field("UTC", description="IANA name, e.g. Europe/Paris.")

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            zone(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not an IANA time zone") from None
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> MaintenanceWindow:
        if self.start_hour == self.end_hour:
            raise ValueError("startHour and endHour are the same: the window would be empty")
        return self


class PrometheusGate(SpecModel):
    """A PromQL query that must pass before each batch (kured-style alert gating).

    With no bounds the query must return nothing (e.g. `ALERTS{alertstate="firing"}`);
    with bounds every sample must lie within them.
    """

    url: BaseUrl = Field(description="Prometheus base URL.")
    query: str = Field(min_length=1)
    min_value: float | None = None
    max_value: float | None = None


class BatchGate(SpecModel):
    """Checked before each batch; while it fails, no node is admitted."""

    prometheus: PrometheusGate | None = None
    node_conditions: list[str] = Field(
        default_factory=list,
        description="Node condition types that must not be True on any targeted node (e.g. KernelDeadlock).",
    )
    interval: Duration = Field(timedelta(seconds=30), description="How often a failing gate is checked again.")
    timeout: Duration = Field(
        timedelta(minutes=30), description="A gate failing this long pauses the rollout for an operator."
    )

    @model_validator(mode="after")
    def _something_to_check(self) -> BatchGate:
        if self.prometheus is None and not self.node_conditions:
            raise ValueError("a gate needs prometheus or nodeConditions")
        if self.interval <= timedelta(0) or self.timeout <= timedelta(0):
            raise ValueError("interval and timeout must be positive durations")
        return self
