"""The rollout spec: what a progressive host-OS rollout installs, where, and how fast.

One pydantic model, `RolloutInput`, is the workflow input. Field names mirror
NVIDIA NodeWright (formerly Skyhook) so its users feel at home: the JSON names are
NodeWright's camelCase (`nodeSelectors`, `dependsOn`, `deploymentPolicy`,
`initialBatch`, ...); Python attributes are snake_case, and either spelling is accepted.

Every spec error is rejected here, before any node is touched, with the field path in
the message: pydantic prefixes the path of the model a validator sits on; cross-field
checks made at the top level put the full path in their own text
(`packages.foo.dependsOn.bar: unknown package 'bar'`). `describe_errors` turns a
`ValidationError` into one `path: message` line per error.

Where NodeWright is unsafe, Millwright is safe by default:

* an empty `nodeSelectors` is rejected unless `allNodes: true` (NodeWright: all nodes);
* without a `deploymentPolicy` the rollout goes one node at a time (NodeWright: all nodes at once);
* `safetyLimit` defaults to 100, so a `failureThreshold` keeps stopping the rollout after
  the halfway point (NodeWright: 50);
* drains have a finite default timeout (30 min) and `stageTimeout` cannot be unbounded;
* `drainConfig.disableEviction: true` is refused: PodDisruptionBudgets always hold;
* drains do not delete emptyDir data nor force-evict unmanaged pods unless asked
  (NodeWright defaults both to true);
* a `dependsOn` version that differs from the dependency's version in the spec is
  rejected (in NodeWright it is never satisfied and the package never runs);
* dependency cycles are rejected (NodeWright's check is incomplete);
* the budget is a hard cap on each batch (see `workflows.rollout.policy.admissible`).

Pure: stdlib + pydantic, plus the selector parser and `DrainSettings`, passed through
the workflow sandbox the way `workflows.maintenance.node_maintenance` does.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from temporalio.common import SearchAttributePair

from activities.kube.models import DrainSettings
from activities.kube.validators import validate_label_selector, validate_object_name, validate_positive_duration
from activities.models import BaseUrl, StrictModel
from activities.support.selectors import Requirement, SelectorError, parse_label_selector, selector_matches
from workflows.budget.budget import Budget
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput
from workflows.rollout.dependency_graph import DependencyCycle, dependency_levels
from workflows.rollout.state import RolloutCheckpoint

DEFAULT_COMPARTMENT = "__default__"

# semver.org 2.0.0, strict: no leading "v", no leading zeros.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
# NodeWright's webhook rule for package names.
_PACKAGE_NAME = re.compile(r"^[a-z][-a-z0-9]{0,41}[a-z]$")
# An image repository path (no tag, no digest), as the distribution spec defines it.
_REPO_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_REGISTRY = re.compile(
    r"^(?:[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?)*(?::\d+)?$"
)
_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_SERVICE = re.compile(r"^[-_.@a-zA-Z0-9:\\]+$")
_GO_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+$")
_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WEEKDAY_NAMES = {name: name for name in WEEKDAYS} | {
    "monday": "mon",
    "tuesday": "tue",
    "wednesday": "wed",
    "thursday": "thu",
    "friday": "fri",
    "saturday": "sat",
    "sunday": "sun",
}


# ---------------------------------------------------------------- helpers


def _go_duration(value: Any) -> Any:
    """Accept NodeWright's Go durations ("10m", "1h30m", "30s") besides pydantic's forms
    (seconds as a number, ISO 8601 such as "PT10M")."""
    if isinstance(value, str) and _GO_DURATION.match(value.strip()):
        seconds = sum(float(n) * _GO_UNITS[unit] for n, unit in _GO_DURATION_PART.findall(value.strip()))
        return timedelta(seconds=seconds)
    return value


Duration = Annotated[timedelta, BeforeValidator(_go_duration)]


def _weekday(value: Any) -> Any:
    if isinstance(value, str):
        return _WEEKDAY_NAMES.get(value.strip().lower(), value)
    return value


Weekday = Annotated[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"], BeforeValidator(_weekday)]


def zone(name: str) -> ZoneInfo:
    """`ZoneInfo(name)`, also inside the Temporal workflow sandbox.

    The sandbox wraps `zoneinfo.ZoneInfo` (and whatever it returns) in a proxy, which
    `datetime.astimezone` refuses. The proxy forwards `__mro__`, whose first entry is the
    real class. Reading the tz database is deterministic for a given worker image.
    """
    real: type[ZoneInfo] = ZoneInfo.__mro__[0]
    return real(name)


def describe_errors(error: ValidationError) -> list[str]:
    """One `path: message` line per error, for a CLI or a pre-flight report."""
    lines = []
    for e in error.errors():
        path = ".".join(str(p) for p in e["loc"])
        message = e["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}" if path else message)
    return lines


class _Spec(StrictModel):
    """NodeWright's camelCase in JSON, snake_case in Python; unknown fields rejected."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True)


# ---------------------------------------------------------------- label selectors


class LabelSelectorRequirement(_Spec):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def _requirement(key: str, op: str, values: tuple[str, ...]) -> Requirement:
    """Build one requirement through the shared parser, so keys and values are checked
    exactly as the API server checks them; a key or value that would change the
    parse (a comma, a parenthesis) is rejected rather than misread."""
    if op == "=":
        text = f"{key}={values[0]}"
    elif op in ("in", "notin"):
        text = f"{key} {op} ({','.join(values)})"
    elif op == "exists":
        text = key
    else:
        text = f"!{key}"
    try:
        parsed = parse_label_selector(text)
    except SelectorError as err:
        raise ValueError(str(err)) from err
    expected = Requirement(key, op, values)
    if parsed != [expected]:
        raise ValueError(f"invalid label key or value in requirement {text!r}")
    return expected


class LabelSelector(_Spec):
    """A Kubernetes `metav1.LabelSelector`: `matchLabels` and/or `matchExpressions`, ANDed.

    Empty means "everything" to Kubernetes; Millwright refuses it wherever that would be
    a surprise (see `RolloutInput.node_selectors` and `pod_non_interrupt_labels`).
    """

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    @model_validator(mode="after")
    def _parseable(self) -> LabelSelector:
        self.requirements()
        return self

    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def requirements(self) -> list[Requirement]:
        reqs = [_requirement(k, "=", (v,)) for k, v in sorted(self.match_labels.items())]
        for i, expr in enumerate(self.match_expressions):
            try:
                reqs.append(_requirement(expr.key, _OPS[expr.operator], tuple(expr.values)))
            except ValueError as err:
                raise ValueError(f"matchExpressions.{i}: {err}") from None
        return reqs

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return selector_matches(self.requirements(), dict(labels or {}))

    def to_selector_string(self) -> str:
        """The string form (`a=b,c in (d,e),!f`) the list APIs take as `labelSelector`."""
        parts = []
        for r in self.requirements():
            if r.op == "=":
                parts.append(f"{r.key}={r.values[0]}")
            elif r.op in ("in", "notin"):
                parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
            elif r.op == "exists":
                parts.append(r.key)
            else:
                parts.append(f"!{r.key}")
        return ",".join(parts)

    def canonical(self) -> tuple[Requirement, ...]:
        """Order-independent identity, used to reject identical compartment selectors."""
        canon = set()
        for r in self.requirements():
            values = tuple(sorted(set(r.values)))
            op = {"in": "=", "notin": "!="}.get(r.op, r.op) if len(values) == 1 else r.op
            canon.add(Requirement(r.key, op, values))
        return tuple(sorted(canon, key=lambda r: (r.key, r.op, r.values)))


# ---------------------------------------------------------------- packages


InterruptType = Literal["reboot", "service", "restartAllServices", "noop"]


class Interrupt(_Spec):
    """What a package needs after it is applied. Any interrupt means cordon → wait → drain first.

    `service` restarts `services` (daemon-reload first). `restartAllServices` is
    NodeWright's name for a sysctl reload (`service procps force-reload`); `services`
    may accompany it (the merged interrupt of a `service` and a `restartAllServices`
    package keeps the services). `reboot` and `noop` take no services.
    """

    type: InterruptType
    services: list[str] = Field(default_factory=list)

    @field_validator("services")
    @classmethod
    def _service_names(cls, value: list[str]) -> list[str]:
        for s in value:
            if not _SERVICE.match(s):
                raise ValueError(f"{s!r} is not a systemd unit name")
        return value

    @model_validator(mode="after")
    def _services_fit_type(self) -> Interrupt:
        if self.type == "service" and not self.services:
            raise ValueError("type 'service' needs at least one entry in services")
        if self.type in ("reboot", "noop") and self.services:
            raise ValueError(f"type {self.type!r} takes no services")
        return self


def _check_semver(value: str) -> str:
    if not _SEMVER.match(value):
        raise ValueError(f"{value!r} is not a semantic version (MAJOR.MINOR.PATCH[-PRERELEASE], e.g. 1.2.3)")
    if "+" in value:
        raise ValueError(f"{value!r}: build metadata ('+') cannot be part of an image tag")
    return value


def _check_image(value: str) -> str:
    if "@" in value:
        raise ValueError(f"{value!r}: give the image without a digest; pin bytes with containerSHA")
    parts = value.split("/")
    if ":" in parts[-1]:
        raise ValueError(f"{value!r}: give the image without a tag; the package version is the tag")
    registry = parts[0] if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost") else None
    repo = parts[1:] if registry else parts
    if registry is not None and not _REGISTRY.match(registry):
        raise ValueError(f"{value!r}: invalid registry {registry!r}")
    if not repo or not all(_REPO_COMPONENT.match(p) for p in repo):
        raise ValueError(f"{value!r} is not an image repository (lowercase registry/repo, no tag)")
    return value


class Uninstall(_Spec):
    """NodeWright's explicit uninstall (v0.16+): `enabled` says the package may be uninstalled, `apply` does it now.

    With `apply`, the rollout runs the package's `uninstall` stage (the scripts of the version the node has), then
    `uninstall-interrupt` when the package has an interrupt, on every targeted node that has it, and takes it out
    of the node's packages annotation; it installs it nowhere.
    """

    enabled: bool = False
    apply: bool = False

    @model_validator(mode="after")
    def _apply_needs_enabled(self) -> Uninstall:
        if self.apply and not self.enabled:
            raise ValueError("apply: true needs enabled: true (NodeWright's rule)")
        return self


class Package(_Spec):
    """One package: a container image whose scripts run on the host (NodeWright's Package)."""

    version: str = Field(description="Strict semver; also the image tag.")
    image: str = Field(min_length=1, max_length=255, description="Bare registry/repo, no tag or digest.")
    container_sha: str | None = Field(None, alias="containerSHA", description="sha256:<64 hex>; pins the image bytes.")
    interrupt: Interrupt | None = None
    config_map: dict[str, str] = Field(default_factory=dict, description="File name → content.")
    config_interrupts: dict[str, Interrupt] = Field(
        default_factory=dict, description="configMap key (or glob) → interrupt to run when that key changes."
    )
    depends_on: dict[str, str] = Field(default_factory=dict, description="Package name → version.")
    stage_timeout: Duration = Field(timedelta(hours=1), description="Bound on one attempt of each stage.")
    uninstall: Uninstall = Field(default_factory=Uninstall)

    _version = field_validator("version")(_check_semver)
    _image = field_validator("image")(_check_image)

    @field_validator("container_sha")
    @classmethod
    def _sha(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256.match(value):
            raise ValueError(f"{value!r} is not sha256:<64 lowercase hex digits>")
        return value

    @field_validator("config_map")
    @classmethod
    def _config_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _CONFIGMAP_KEY.match(key) or key in (".", "..") or len(key) > 253:
                raise ValueError(f"key {key!r} is not a file name (letters, digits, '-', '_', '.'; no '/')")
        return value

    @field_validator("config_interrupts")
    @classmethod
    def _config_interrupts_match(cls, value: dict[str, Interrupt], info: ValidationInfo) -> dict[str, Interrupt]:
        config_map = info.data.get("config_map")
        if config_map is None:  # configMap itself was invalid; that error is reported
            return value
        for pattern in value:
            if not any(fnmatch.fnmatchcase(key, pattern) for key in config_map):
                raise ValueError(f"key {pattern!r} matches no configMap key")
        return value

    @field_validator("depends_on")
    @classmethod
    def _dependency_versions(cls, value: dict[str, str]) -> dict[str, str]:
        for name, version in value.items():
            try:
                _check_semver(version)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
        return value

    @field_validator("stage_timeout")
    @classmethod
    def _finite_stage_timeout(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be a positive duration (Millwright has no unbounded stages)")
        return value

    def config_interrupt(self, changed_keys: Iterable[str]) -> list[Interrupt]:
        """The configInterrupts entries matching any changed configMap key (to be coalesced)."""
        keys = list(changed_keys)
        return [
            i
            for pattern, i in sorted(self.config_interrupts.items())
            if any(fnmatch.fnmatchcase(k, pattern) for k in keys)
        ]


# ---------------------------------------------------------------- drain


class DrainConfig(_Spec):
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


# ---------------------------------------------------------------- deployment policy


class _StrategyParams(_Spec):
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


class Strategy(_Spec):
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


class PolicyDefault(_Spec):
    """Budget and strategy for nodes matching no compartment (`__default__`)."""

    budget: Budget
    strategy: Strategy


class Compartment(_Spec):
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


class DeploymentPolicy(_Spec):
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


class DeploymentPolicyOptions(_Spec):
    """NodeWright's `deploymentPolicyOptions`: this rollout's overrides of its policy's settings."""

    reset_batch_state_on_completion: bool | None = Field(
        None, description="Overrides deploymentPolicy.resetBatchStateOnCompletion for this rollout when set."
    )


# ---------------------------------------------------------------- windows


class MaintenanceWindow(_Spec):
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


# ---------------------------------------------------------------- gates


class PrometheusGate(_Spec):
    """A PromQL query that must pass before each batch (kured-style alert gating).

    With no bounds the query must return nothing (e.g. `ALERTS{alertstate="firing"}`);
    with bounds every sample must lie within them.
    """

    url: BaseUrl = Field(description="Prometheus base URL.")
    query: str = Field(min_length=1)
    min_value: float | None = None
    max_value: float | None = None


class BatchGate(_Spec):
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


# ---------------------------------------------------------------- the input


Approval = Literal["none", "batch", "compartment"]


class RolloutInput(WorkflowInput):
    """A progressive host-OS rollout of `packages` to the nodes selected by `nodeSelectors`."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True)

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    name: str = Field(description="Change id; names the rollout (and its workflow).")
    all_nodes: bool = Field(False, description="Required to target every node (an empty nodeSelectors).")
    node_selectors: LabelSelector = Field(default_factory=LabelSelector)
    packages: dict[str, Package] = Field(min_length=1)
    pod_non_interrupt_labels: LabelSelector | None = Field(
        None, description="Pods that must finish before a node is drained. Omit to protect none."
    )
    non_interrupt_retry_interval: Duration = Field(
        timedelta(minutes=1),
        description="A node left alone because its non-interruptible pods still run is tried again after this.",
    )
    drain_config: DrainConfig = Field(default_factory=DrainConfig)
    deployment_policy: DeploymentPolicy = Field(default_factory=DeploymentPolicy)
    deployment_policy_options: DeploymentPolicyOptions = Field(default_factory=DeploymentPolicyOptions)
    approval: Approval = Field("none", description="Wait for approve_batch before each batch or each compartment.")
    maintenance_windows: list[MaintenanceWindow] = Field(
        default_factory=list, description="Empty: any time. Otherwise no node is admitted outside them."
    )
    soak_time: Duration = Field(timedelta(0), description="Wait after each batch before judging the next.")
    gate: BatchGate | None = Field(None, description="A check that must pass before each batch.")
    max_in_flight: int = Field(
        200,
        ge=1,
        le=500,
        description="Nodes of one batch updated at once (a few hundred at most keeps histories small).",
    )
    stage_retries: int = Field(
        3, ge=0, le=10, description="Retries of a failed stage Job (NodeWright's backoff limit)."
    )
    reboot_timeout: Duration = Field(
        timedelta(minutes=30), description="A rebooted node must be Ready again within this."
    )
    allow_downgrade: bool = Field(
        False, description="Install a package over a later version a node has (else that node is refused, untouched)."
    )
    runtime_required: bool = Field(
        False,
        description="A node's packages must be complete before it takes work: the runtime-required taint "
        "(nodewright.nvidia.com=runtime-required:NoSchedule) is removed from it once they are, never while they fail.",
    )
    auto_taint_new_nodes: bool = Field(
        False,
        description="Give each new node (none of Millwright's annotations yet) the runtime-required taint "
        "when the rollout reaches it; needs runtimeRequired.",
    )
    dry_run: bool = Field(False, description="Only compute and report the plan; write nothing.")
    checkpoint: RolloutCheckpoint | None = Field(
        None, description="Internal: the state a continued run carries. Leave it out when starting a rollout."
    )

    _names = field_validator("cluster", "name")(validate_object_name)

    @field_validator("packages")
    @classmethod
    def _package_names(cls, value: dict[str, Package]) -> dict[str, Package]:
        for name in value:
            if not _PACKAGE_NAME.match(name):
                raise ValueError(
                    f"packages.{name}: a package name must match {_PACKAGE_NAME.pattern} (NodeWright's rule)"
                )
        return value

    @field_validator("pod_non_interrupt_labels")
    @classmethod
    def _protect_explicitly(cls, value: LabelSelector | None) -> LabelSelector | None:
        if value is not None and value.is_empty():
            raise ValueError(
                "an empty selector protects every pod in Kubernetes and none in NodeWright; "
                "omit the field to protect none"
            )
        return value

    @field_validator("soak_time")
    @classmethod
    def _soak(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("must not be negative")
        return value

    _positive = field_validator("reboot_timeout", "non_interrupt_retry_interval")(validate_positive_duration)

    @model_validator(mode="after")
    def _cross_field(self) -> RolloutInput:
        if self.node_selectors.is_empty() and not self.all_nodes:
            raise ValueError(
                "nodeSelectors: an empty selector matches every node; set allNodes: true to target all nodes on purpose"
            )
        if self.all_nodes and not self.node_selectors.is_empty():
            raise ValueError("allNodes: true conflicts with a non-empty nodeSelectors; use one or the other")
        if self.auto_taint_new_nodes and not self.runtime_required:
            raise ValueError("autoTaintNewNodes: the taint it places is removed only with runtimeRequired: true")
        for name in sorted(self.packages):
            for dep, version in sorted(self.packages[name].depends_on.items()):
                path = f"packages.{name}.dependsOn.{dep}"
                if dep not in self.packages:
                    raise ValueError(f"{path}: unknown package {dep!r}")
                if self.packages[dep].uninstall.apply and not self.packages[name].uninstall.apply:
                    raise ValueError(f"{path}: {dep!r} is being uninstalled (uninstall.apply) and {name!r} is not: "
                                     "uninstall both or neither")  # fmt: skip
                if dep == name:
                    raise ValueError(f"{path}: a package cannot depend on itself")
                if version != self.packages[dep].version:
                    raise ValueError(
                        f"{path}: depends on version {version} but the spec installs {self.packages[dep].version}"
                    )
        try:
            dependency_levels({n: p.depends_on for n, p in self.packages.items()})
        except DependencyCycle as err:
            raise ValueError(f"packages.{err.cycle[0]}.dependsOn: {err}") from None
        return self

    def resets_batch_state(self) -> bool:
        """`resetBatchStateOnCompletion`: the rollout's override, else the policy's."""
        override = self.deployment_policy_options.reset_batch_state_on_completion
        return self.deployment_policy.reset_batch_state_on_completion if override is None else override

    def package_versions(self) -> dict[str, str]:
        return {name: p.version for name, p in sorted(self.packages.items())}

    def workflow_id(self) -> str:
        # A dry run never collides with (or attaches to) the rollout it plans.
        return f"rollout-plan/{self.cluster}/{self.name}" if self.dry_run else f"rollout/{self.cluster}/{self.name}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [
            SearchAttributePair(sa.CLUSTER, self.cluster),
            SearchAttributePair(sa.PHASE, "planning" if self.dry_run else "pending"),
        ]
