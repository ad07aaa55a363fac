"""The rollout's arithmetic: compartments, ceilings, batch sizes, evaluation, the stop rule.

A port of NodeWright's DeploymentPolicy engine (`operator/internal/wrapper/compartment.go`,
`deployment_policy_types.go`, `AssignNodeToCompartment` in `cluster_state_v2.go`) as pure,
deterministic functions: no I/O, no clock, no randomness; stdlib + pydantic only, safe
inside the Temporal workflow sandbox. State is an immutable-in-practice `BatchState`
(each function returns a new one) that a workflow carries across continue-as-new.

Where Millwright deliberately departs from NodeWright (each is marked "DEPARTURE"):

1. **The budget caps the batch.** NodeWright ignores `budget` once a compartment has a
   strategy, so exponential batches grow to the whole compartment. Millwright applies
   `admissible(batch, ceiling, unavailable_now)` on top of the strategy: no batch puts
   more nodes out of service than the ceiling minus the compartment's nodes already
   unavailable for any reason (cordoned by anyone, NotReady, left cordoned by a failure).
   A node already out of service costs nothing more to take (`admit`).
2. **`safetyLimit` defaults to 100** (in the spec), so `failureThreshold` keeps stopping
   the rollout after the halfway point. The stop rule itself is NodeWright's.
3. **Ceiling in exact integers.** NodeWright computes `int(float64(matched) * (percent/100))`,
   which is one low for some inputs (29% of 100 nodes gives 28); Millwright uses
   `matched * percent // 100`, the documented formula.
4. **Nothing left means a batch of 0.** NodeWright's `max(1, ...)` returns 1 when no node
   remains (and `fixed` does so even for an empty compartment); here the size is 0
   then, and in every other case the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from activities.kube.topology import BatchBy, Gang, NodePlace, TopologyLabels, place_of
from activities.models import StrictModel
from activities.support.selectors import Requirement, selector_matches
from workflows.budget.budget import Budget, ceiling
from workflows.rollout.dependency_graph import dependency_levels, topological_order
from workflows.rollout.spec.admission import MaintenanceWindow
from workflows.rollout.spec.deployment_policy import DEFAULT_COMPARTMENT, Compartment, DeploymentPolicy, Strategy
from workflows.rollout.spec.fleet import FleetSpec
from workflows.rollout.spec.packages import Interrupt, Package
from workflows.rollout.spec.spec import RolloutInput
from workflows.rollout.spec.spec_fields import WEEKDAYS, zone
from workflows.rollout.state import BatchState
from workflows.rollout.unit_batching import oversized_unit, own_domain_note, unit_batch

__all__ = [
    "NODE_PRIORITY_LABEL",
    "CompartmentPlan",
    "NodeSnapshot",
    "Plan",
    "PlannedBatch",
    "admissible",
    "admit",
    "assign_compartments",
    "batch_order",
    "choose_compartment",
    "coalesce_interrupts",
    "compartment_budget",
    "compartment_strategy",
    "config_change_interrupt",
    "evaluate_batch",
    "next_batch_size",
    "next_window_open",
    "node_priority",
    "package_order",
    "package_waves",
    "places_of",
    "plan",
    "progress_percent",
    "should_stop",
    "strategy_name",
    "strategy_rank",
    "success_percent",
    "unit_over_ceiling",
    "window_open",
]

StrategyName = Literal["fixed", "linear", "exponential", "none"]

# NodeWright's strategySafetyOrder: fixed 0, linear 1, exponential 2, no strategy 999 (least safe).
_RANK = {"fixed": 0, "linear": 1, "exponential": 2, "none": 999}

# NodeWright's interrupt priority when merging a node's interrupts (reboot wins).
_INTERRUPT_PRIORITY = {"noop": 0, "service": 1, "restartAllServices": 2, "reboot": 3}


class _State(StrictModel):
    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True)


class NodeSnapshot(_State):
    """What the plan needs of a live node."""

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True
    created: str | None = Field(None, description="metadata.creationTimestamp: oldest first in a rollout's order.")

    @property
    def unavailable(self) -> bool:
        """Out of service for any reason: cordoned by anyone, or NotReady."""
        return self.unschedulable or not self.ready


# ---------------------------------------------------------------- compartments


def strategy_name(strategy: Strategy | None) -> StrategyName:
    return "none" if strategy is None else strategy.kind


def strategy_rank(strategy: Strategy | None) -> int:
    """Safety order for overlapping compartments: fixed < linear < exponential < no strategy."""
    return _RANK[strategy_name(strategy)]


def compartment_budget(policy: DeploymentPolicy, name: str) -> Budget:
    if name == DEFAULT_COMPARTMENT:
        return policy.default.budget
    return next(c.budget for c in policy.compartments if c.name == name)


def compartment_strategy(policy: DeploymentPolicy, name: str) -> Strategy | None:
    if name == DEFAULT_COMPARTMENT:
        return policy.default.strategy
    return next(c.strategy for c in policy.compartments if c.name == name)


def choose_compartment(labels: Mapping[str, str], policy: DeploymentPolicy, matched_counts: Mapping[str, int]) -> str:
    """NodeWright's `AssignNodeToCompartment`. Among the compartments whose selector matches,
    the safest wins: strategy fixed < linear < exponential < none, then the smaller ceiling
    (computed over the nodes the compartment's selector matches, at least 1), then the name.
    No match: `__default__`."""
    return _choose(labels, [(c, c.selector.requirements()) for c in policy.compartments], matched_counts)


def _choose(
    labels: Mapping[str, str],
    compartments: Sequence[tuple[Compartment, list[Requirement]]],
    matched_counts: Mapping[str, int],
) -> str:
    best: tuple[int, int, str] | None = None
    for c, requirements in compartments:
        if not selector_matches(requirements, dict(labels)):
            continue
        key = (strategy_rank(c.strategy), ceiling(c.budget, max(1, matched_counts.get(c.name, 0))), c.name)
        if best is None or key < best:
            best = key
    return DEFAULT_COMPARTMENT if best is None else best[2]


def assign_compartments(nodes: Sequence[NodeSnapshot], policy: DeploymentPolicy) -> dict[str, list[str]]:
    """Every node in exactly one compartment. Returns every compartment of the policy
    (spec order, `__default__` last), each with its members sorted by name."""
    compartments = [(c, c.selector.requirements()) for c in policy.compartments]
    matched = {c.name: sum(1 for n in nodes if selector_matches(reqs, n.labels)) for c, reqs in compartments}
    result: dict[str, list[str]] = {c.name: [] for c in policy.compartments}
    result[DEFAULT_COMPARTMENT] = []
    for node in nodes:
        result[_choose(node.labels, compartments, matched)].append(node.name)
    return {name: sorted(members) for name, members in result.items()}


# ---------------------------------------------------------------- node order

# The node label that orders a rollout's nodes, with the semantics of NodeWright's `priority` (a positive integer,
# lower first, 200 when unset); see docs/rollout-batch-planning.md.
NODE_PRIORITY_LABEL = "nodewright.nvidia.com/priority"
DEFAULT_NODE_PRIORITY = 200


def node_priority(labels: Mapping[str, str]) -> int:
    """The node's priority label as NodeWright reads `priority`; unset or not a positive integer: 200."""
    value = labels.get(NODE_PRIORITY_LABEL, "")
    return int(value) if value.isdigit() and int(value) >= 1 else DEFAULT_NODE_PRIORITY


def priority_warning(node: NodeSnapshot) -> str | None:
    value = node.labels.get(NODE_PRIORITY_LABEL)
    if value is None or node_priority(node.labels) != DEFAULT_NODE_PRIORITY or value == str(DEFAULT_NODE_PRIORITY):
        return None
    return f"node {node.name}: label {NODE_PRIORITY_LABEL}={value!r} is not a positive integer; it counts as 200"


def batch_order(
    candidates: Iterable[str],
    nodes: Mapping[str, NodeSnapshot],
    states: Mapping[str, str] | None = None,
    unavailable: set[str] | None = None,
) -> list[str]:
    """The order a batch takes its nodes in: priority label (lower first), then nodes that are not retries
    (an erroring node goes after every waiting one, as NodeWright re-picks erroring nodes last), then nodes
    already out of service (they cost the budget nothing more), then waiting before blocked, then the stable
    order: oldest node first (creationTimestamp), then name. A node missing from `nodes` sorts as unlabelled.
    Without `states` and `unavailable` (a plan), the priority label and the stable order alone."""
    states, out = states or {}, unavailable or set()

    def key(name: str) -> tuple[int, bool, bool, bool, str, str]:
        node = nodes.get(name)
        labels = node.labels if node is not None else {}
        created = (node.created if node is not None else None) or ""
        state = states.get(name)
        taken_first = unavailable is None or name in out
        return (node_priority(labels), state == "erroring", not taken_first, state == "blocked", created, name)

    return sorted(candidates, key=key)


# ---------------------------------------------------------------- batches


def _remaining(state: BatchState, total: int) -> int:
    return total - state.completed_nodes - state.failed_nodes


def progress_percent(state: BatchState, total: int) -> int:
    """`(completed + failed) * 100 / total`, integer division; 0 for an empty compartment."""
    if total <= 0:
        return 0
    return (state.completed_nodes + state.failed_nodes) * 100 // total


def next_batch_size(strategy: Strategy | None, state: BatchState, total: int, budget_ceiling: int) -> int:
    """NodeWright's `CalculateBatchSize`, before Millwright's cap (`admissible`).

    * fixed: `initialBatch`;
    * linear: `initialBatch` first, then `last + delta`, or `max(1, last - delta)` when the last
      batch failed and progress < `safetyLimit`;
    * exponential: likewise with `last * growthFactor` / `max(1, last // growthFactor)`,
      capped at the compartment size;
    * no strategy: the budget's ceiling;
    * then clamped to the nodes remaining, minimum 1 (0 when none remain: DEPARTURE 4).
    """
    remaining = _remaining(state, total)
    if remaining <= 0:
        return 0
    if strategy is None:
        size = budget_ceiling
    else:
        p = strategy.params
        if strategy.kind == "fixed" or state.last_batch_size <= 0:
            size = p.initial_batch
        else:
            shrink = state.last_batch_failed and progress_percent(state, total) < p.safety_limit
            if strategy.linear is not None:
                d = strategy.linear.delta
                size = max(1, state.last_batch_size - d) if shrink else state.last_batch_size + d
            else:
                assert strategy.exponential is not None
                g = strategy.exponential.growth_factor
                size = max(1, state.last_batch_size // g) if shrink else state.last_batch_size * g
                size = min(size, total)
    return max(1, min(size, remaining))


def admissible(batch_size: int, budget_ceiling: int, unavailable_now: int) -> int:
    """Millwright's hard cap (DEPARTURE 1): how many of `batch_size` nodes may be taken
    out of service now, given the compartment's ceiling and its nodes already unavailable
    for any reason. `max(0, min(batch_size, ceiling - unavailable_now))`; 0 means wait."""
    return max(0, min(batch_size, budget_ceiling - unavailable_now))


def admit(order: Sequence[str], unavailable: set[str], batch_size: int, budget_ceiling: int) -> list[str]:
    """The nodes of `order` a batch of `batch_size` takes (DEPARTURE 1, as the disruption budget grants): one
    already out of service costs nothing more, so it is taken whatever the room left (an erroring node left
    cordoned, due for its retry, fills no more of the ceiling than it already does); any other only while the
    ceiling minus the unavailable nodes leaves room. Empty means wait."""
    room = max(0, budget_ceiling - len(unavailable))
    chosen: list[str] = []
    for node in order:
        if len(chosen) == batch_size:
            break
        if node in unavailable or room > 0:
            room -= node not in unavailable
            chosen.append(node)
    return chosen


def success_percent(succeeded: int, failed: int) -> int:
    """`successes * 100 / batchSize` in integer division, where the batch size counts only
    nodes with an outcome (blocked nodes are excluded). 0 for an empty batch."""
    size = succeeded + failed
    return 0 if size <= 0 else succeeded * 100 // size


def should_stop(failure_threshold: int | None, safety_limit: int, consecutive_failures: int, progress: int) -> bool:
    """NodeWright's stop rule: `failureThreshold != nil && progress < safetyLimit &&
    consecutiveFailures >= failureThreshold`."""
    return failure_threshold is not None and progress < safety_limit and consecutive_failures >= failure_threshold


def evaluate_batch(strategy: Strategy | None, state: BatchState, succeeded: int, failed: int, total: int) -> BatchState:
    """NodeWright's `EvaluateBatchResult` for a finished batch; returns the new state.

    `succeeded`/`failed` count the batch's nodes that completed / ended erroring; blocked
    nodes are left out. A batch with no outcome (only blocked nodes) is not evaluated:
    the state comes back unchanged. A failed batch (success% < `batchThreshold`) bumps
    `consecutiveFailures`; a passed one resets it. `shouldStop` is set per the stop rule,
    with progress counted after this batch, and only a reset clears it.
    """
    size = succeeded + failed
    if size <= 0:
        return state
    completed = state.completed_nodes + succeeded
    failed_total = state.failed_nodes + failed
    update: dict[str, object] = {
        "completed_nodes": completed,
        "failed_nodes": failed_total,
        "current_batch": state.current_batch + 1,
        "last_batch_size": size,
    }
    if strategy is None:
        # NodeWright: without a strategy only the counters move.
        return state.model_copy(update=update)
    p = strategy.params
    batch_failed = success_percent(succeeded, failed) < p.batch_threshold
    update["last_batch_failed"] = batch_failed
    if batch_failed:
        consecutive = state.consecutive_failures + 1
        update["consecutive_failures"] = consecutive
        progress = progress_percent(BatchState(completed_nodes=completed, failed_nodes=failed_total), total)
        if should_stop(p.failure_threshold, p.safety_limit, consecutive, progress):
            update["should_stop"] = True
    else:
        update["consecutive_failures"] = 0
    return state.model_copy(update=update)


# ---------------------------------------------------------------- packages and interrupts


def package_order(packages: Mapping[str, Package]) -> list[str]:
    """Dependencies first, ties by name (the function spec validation uses for cycles)."""
    return topological_order({name: p.depends_on for name, p in packages.items()})


def package_waves(packages: Mapping[str, Package]) -> list[list[str]]:
    """Packages in waves that may run in parallel on a node: each wave depends only on earlier ones."""
    return dependency_levels({name: p.depends_on for name, p in packages.items()})


def coalesce_interrupts(
    items: Mapping[str, Package] | Iterable[Interrupt | Package | None],
) -> Interrupt | None:
    """One interrupt per node per pass, as NodeWright merges them: reboot > restartAllServices
    > service > noop, services unioned (sorted). A reboot drops the services (the reboot
    restarts everything). When restartAllServices wins over service, the services are kept
    and restarted too: NodeWright's restartAllServices only reloads sysctl, so dropping them
    would skip the restarts. None when nothing needs an interrupt.

    Accepts packages (a mapping or an iterable; each contributes its `interrupt`) or interrupts.
    """
    values = items.values() if isinstance(items, Mapping) else items
    interrupts = [v.interrupt if isinstance(v, Package) else v for v in values]
    present = [i for i in interrupts if i is not None]
    if not present:
        return None
    kind = max((i.type for i in present), key=_INTERRUPT_PRIORITY.__getitem__)
    if kind in ("reboot", "noop"):
        return Interrupt(type=kind)
    services = sorted({s for i in present for s in i.services})
    return Interrupt(type=kind, services=services)


def config_change_interrupt(package: Package, changed_keys: Iterable[str]) -> Interrupt | None:
    """The interrupt a configMap change needs: the strongest matching configInterrupts entry."""
    return coalesce_interrupts(package.config_interrupt(changed_keys))


# ---------------------------------------------------------------- maintenance windows


def _in_window(window: MaintenanceWindow, at: datetime) -> bool:
    local = at.astimezone(zone(window.time_zone))
    day = WEEKDAYS[local.weekday()]
    end = window.end_hour or 24
    hour = local.hour
    if window.start_hour < end:
        return day in window.days and window.start_hour <= hour < end
    # Wraps past midnight: opened today, or opened yesterday and not yet closed.
    yesterday = WEEKDAYS[(local.weekday() - 1) % 7]
    return (day in window.days and hour >= window.start_hour) or (yesterday in window.days and hour < end)


def window_open(windows: Sequence[MaintenanceWindow], at: datetime) -> bool:
    """True when `at` (timezone-aware) lies in any window; no windows means always open."""
    if at.tzinfo is None:
        raise ValueError("at must be timezone-aware")
    return not windows or any(_in_window(w, at) for w in windows)


def next_window_open(windows: Sequence[MaintenanceWindow], at: datetime) -> datetime | None:
    """The first instant at or after `at` when a window is open (`at` itself if one is).

    Window edges fall on local hours, and every real UTC offset is a multiple of 15
    minutes, so the search steps through quarter hours of UTC for 8 days. None if no
    window opens in that time (cannot happen for a valid window).
    """
    if window_open(windows, at):
        return at
    step = timedelta(minutes=15)
    utc = at.astimezone(UTC)
    t = utc.replace(second=0, microsecond=0) - timedelta(minutes=utc.minute % 15) + step
    for _ in range(8 * 24 * 4):
        if window_open(windows, t):
            return t.astimezone(at.tzinfo)
        t += step
    return None


# ---------------------------------------------------------------- plan


class PlannedBatch(_State):
    nodes: list[str]
    strategy_size: int = Field(description="What the strategy asked for, before the budget cap.")
    units: dict[str, list[str]] = Field(
        default_factory=dict, description="With batchBy: the units (NVLink domains, racks) it takes -> their nodes."
    )
    gangs: list[str] = Field(default_factory=list, description="With batchBy: the running gangs it would interrupt.")


class CompartmentPlan(_State):
    name: str
    strategy: StrategyName
    members: list[str]
    unavailable: list[str] = Field(description="Members already out of service (cordoned by anyone, NotReady).")
    ceiling: int = Field(description="The budget over the members: the most nodes out of service at once.")
    batches: list[PlannedBatch] = Field(description="The batch sequence, assuming every batch succeeds.")
    largest_batch: int
    worst_case_out_of_service: int = Field(description="Already unavailable + the largest batch.")
    blocked: str | None = Field(None, description="Why no batch can be admitted now.")


class Plan(_State):
    """What a rollout would do to the live node list; computed without writing anything."""

    cluster: str
    name: str
    targeted: int = Field(description="Nodes the node selectors match.")
    compartments: list[CompartmentPlan]
    worst_case_out_of_service: int = Field(
        description="Compartments progress in parallel: the sum of their worst cases."
    )
    package_order: list[str]
    interrupt: Interrupt | None = Field(description="The merged interrupt of a first install on a node.")
    warnings: list[str] = Field(default_factory=list)


def places_of(nodes: Iterable[NodeSnapshot], keys: TopologyLabels) -> dict[str, NodePlace]:
    return {n.name: place_of(n.name, n.labels, keys) for n in nodes}


def unit_over_ceiling(
    nodes: Sequence[NodeSnapshot], assignment: Mapping[str, list[str]], spec: FleetSpec
) -> str | None:
    """With batchBy: why a compartment's unit can never be taken whole (more nodes than its ceiling); None: all fit."""
    if spec.batch_by == "none":
        return None
    places = places_of(nodes, spec.topology)
    for name, members in assignment.items():
        cap = ceiling(compartment_budget(spec.deployment_policy, name), len(members))
        if refusal := oversized_unit(name, members, places, spec.batch_by, cap):
            return refusal
    return None


class _Topology(StrictModel):
    """What a plan with batchBy set reads besides the nodes."""

    batch_by: BatchBy
    places: dict[str, NodePlace]
    gangs: list[Gang]


def _plan_compartment(
    name: str, strategy: Strategy | None, budget: Budget, members: list[NodeSnapshot], topology: _Topology | None
) -> CompartmentPlan:
    names = [n.name for n in members]
    unavailable = [n.name for n in members if n.unavailable]
    by_name = {n.name: n for n in members}
    total = len(members)
    cap = ceiling(budget, total)
    state = BatchState()
    batches: list[PlannedBatch] = []
    blocked = None
    queue = batch_order(names, by_name)
    if topology is not None and (refusal := oversized_unit(name, names, topology.places, topology.batch_by, cap)):
        blocked, queue = refusal, []
    gangs = topology.gangs if topology is not None else []
    while queue:
        size = next_batch_size(strategy, state, total, cap)
        if topology is not None:
            taken = unit_batch(queue, topology.places, topology.batch_by, gangs, set(unavailable), size, cap)
            batch = PlannedBatch(nodes=taken.nodes, strategy_size=size, units=taken.units, gangs=taken.gangs)
            # A gang this batch interrupts restarts: it joins no later batch's units.
            gangs = [g.model_copy(update={"running": 0}) if g.id in taken.gangs else g for g in gangs]
        else:
            batch = PlannedBatch(nodes=queue[: admissible(size, cap, len(unavailable))], strategy_size=size)
        if not batch.nodes:
            blocked = (
                f"{len(unavailable)} of {total} nodes already out of service; the ceiling is {cap}: "
                "no node can be admitted until some return"
            )
            break
        batches.append(batch)
        taken_nodes = set(batch.nodes)
        queue = [n for n in queue if n not in taken_nodes]
        state = evaluate_batch(strategy, state, succeeded=len(batch.nodes), failed=0, total=total)
    largest = max((len(b.nodes) for b in batches), default=0)
    return CompartmentPlan(
        name=name,
        strategy=strategy_name(strategy),
        members=names,
        unavailable=unavailable,
        ceiling=cap,
        batches=batches,
        largest_batch=largest,
        worst_case_out_of_service=len(unavailable) + largest,
        blocked=blocked,
    )


def plan(nodes: Sequence[NodeSnapshot], spec: RolloutInput, gangs: Sequence[Gang] = ()) -> Plan:
    """Dry run: which nodes fall in which compartment, the batch sequence of each (assuming
    every batch succeeds, under the budget cap with today's unavailable nodes), and the
    worst-case number of nodes out of service at once. With `batchBy`, batches of whole units and the
    gangs (`gangs`, the cluster's) each would interrupt. Pure: reads only its arguments."""
    if spec.all_nodes:
        targeted = list(nodes)
    else:
        requirements = spec.node_selectors.requirements()
        targeted = [n for n in nodes if selector_matches(requirements, n.labels)]
    targeted.sort(key=lambda n: n.name)
    by_name = {n.name: n for n in targeted}
    policy = spec.deployment_policy
    assignment = assign_compartments(targeted, policy)
    places = places_of(targeted, spec.topology) if spec.batch_by != "none" else {}
    topology = _Topology(batch_by=spec.batch_by, places=places, gangs=list(gangs)) if places else None
    compartments = [
        _plan_compartment(
            name,
            compartment_strategy(policy, name),
            compartment_budget(policy, name),
            [by_name[m] for m in members],
            topology,
        )
        for name, members in assignment.items()
    ]
    warnings = []
    if spec.batch_by == "nvlinkDomain" and (note := own_domain_note(list(places.values()), spec.topology.clique)):
        warnings.append(note)
    if not targeted:
        warnings.append("the node selectors match no node")
    for c in compartments:
        if not c.members and c.name != DEFAULT_COMPARTMENT:
            warnings.append(f"compartment {c.name!r} has no node")
        if c.blocked:
            warnings.append(f"compartment {c.name!r}: {c.blocked}")
    warnings += [w for n in targeted if (w := priority_warning(n))]
    return Plan(
        cluster=spec.cluster,
        name=spec.name,
        targeted=len(targeted),
        compartments=compartments,
        worst_case_out_of_service=sum(c.worst_case_out_of_service for c in compartments),
        package_order=package_order(spec.packages),
        interrupt=coalesce_interrupts(spec.packages),
        warnings=warnings,
    )
