"""The rollout spec's `drainConfig`: how a node's pods are evicted before an interrupt."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, field_validator

from activities.kube.models import DrainSettings
from activities.kube.validators import validate_label_selector
from workflows.rollout.spec.spec_fields import Duration, SpecModel


class DrainConfig(SpecModel):
    """NodeWright's `drainConfig`, with Millwright's safe defaults; runs as `activities.kube.models.DrainSettings`.

    A separate model rather than `DrainSettings` itself because the JSON names differ
    (NodeWright's camelCase), Go durations ("10m") must be accepted, unknown fields must
    be rejected, and `disableEviction` must be refused. `settings()` converts.
    """

    disable_eviction: bool = Field(False, description="Refused when true: drains always go through the eviction API.")
    delete_empty_dir_data: bool = Field(False, description="Evict pods using emptyDir (their data is lost).")
    force: bool = Field(False, description="Evict pods no controller will recreate.")
    ignore_daemon_sets: bool = True
    timeout: Duration = Field(timedelta(minutes=30), description="Give up the drain after this long (finite).")
    grace_period: Duration | None = Field(None, description="Override each pod's termination grace period.")
    pod_selector: str | None = Field(None, description="Only drain pods matching this label selector.")

    _selector = field_validator("pod_selector")(validate_label_selector)

    @field_validator("disable_eviction")
    @classmethod
    def _keep_eviction(cls, value: bool) -> bool:
        if value:
            raise ValueError("Millwright always drains through the eviction API so PodDisruptionBudgets hold")
        return value

    @field_validator("timeout")
    @classmethod
    def _finite_timeout(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be a positive duration (drains are never unbounded)")
        return value

    @field_validator("grace_period")
    @classmethod
    def _grace(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(0):
            raise ValueError("must not be negative")
        return value

    def settings(self) -> DrainSettings:
        grace = None
        if self.grace_period is not None:
            grace = int(-(-self.grace_period.total_seconds() // 1))  # whole seconds, rounded up
        return DrainSettings(
            ignore_daemonsets=self.ignore_daemon_sets,
            delete_emptydir_data=self.delete_empty_dir_data,
            force=self.force,
            grace_period_seconds=grace,
            pod_selector=self.pod_selector,
            timeout=self.timeout,
        )
