"""Batches that follow topology and jobs (`batchBy`, docs/rollout-batch-planning.md): a batch takes whole NVLink
domains (or racks), and every unit a gang runs on in the same batch, so that a fleet run interrupts each gang once.

Pure, deterministic functions over a node order (workflows/rollout/batching.py's `batch_order`), the nodes' places
and the cluster's gangs (activities/kube/topology.py); safe inside the workflow sandbox.

* **Units**: the pending nodes grouped by `unit_of(place, batchBy)`.
* **Groups**: units joined where a gang that is still whole runs on both (taking its nodes in two batches would
  interrupt it twice). A gang already disrupted joins nothing: it restarts whatever else is taken of it.
* **Order**: groups that interrupt nothing (no GPU work, or only gangs already disrupted) first, then the policy's
  order (a group's first node in the node order).
* **Fill**: the room is the strategy's size rounded up to whole units, capped by the ceiling's room; the batch takes
  the whole groups that fill it best (a subset sum, ties to the order). When no whole group fits, whole units of the
  first group, in order; never part of a unit. A node already out of service costs nothing (as `admit`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field

from activities.kube.topology import CLIQUE_LABEL, BatchBy, Gang, NodePlace, unit_of
from activities.models import StrictModel

UNIT_NAMES = {"nvlinkDomain": "NVLink domain", "rack": "rack", "none": "node"}
OWN_DOMAINS_SHOWN = 10


class UnitBatch(StrictModel):
    """One batch decision with `batchBy` set."""

    nodes: list[str] = Field(default_factory=list, description="The batch's nodes, in the node order.")
    units: dict[str, list[str]] = Field(default_factory=dict, description="Unit -> its nodes in the batch.")
    gangs: list[str] = Field(default_factory=list, description="Gangs still whole that the batch interrupts.")


def units_of(order: Sequence[str], places: Mapping[str, NodePlace], batch_by: BatchBy) -> dict[str, list[str]]:
    """Unit -> its nodes, both in the order of `order`. A node without a place is a unit of its own."""
    units: dict[str, list[str]] = {}
    for node in order:
        place = places.get(node) or NodePlace(node=node, domain=f"node:{node}")
        units.setdefault(unit_of(place, batch_by), []).append(node)
    return units


def groups_of(units: Mapping[str, list[str]], gangs: Sequence[Gang]) -> tuple[list[list[str]], set[str]]:
    """Units joined by the gangs still whole that run on more than one of them (connected components), each group's
    units in the order of `units`; and the units such gangs run on (the others interrupt nothing)."""
    unit_of_node = {n: u for u, nodes in units.items() for n in nodes}
    position = {u: i for i, u in enumerate(units)}
    parent = {u: u for u in units}

    def root(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    busy: set[str] = set()
    for gang in gangs:
        if gang.disrupted:
            continue
        touched = sorted({unit_of_node[n] for n in gang.nodes if n in unit_of_node}, key=position.__getitem__)
        busy.update(touched)
        for u in touched[1:]:
            parent[root(u)] = root(touched[0])
    groups: dict[str, list[str]] = {}
    for u in units:
        groups.setdefault(root(u), []).append(u)
    return list(groups.values()), busy


def _best_subset(costs: Sequence[int], room: int) -> list[int]:
    """The indices of the items whose costs sum closest to `room` without passing it; among equal sums the one that
    takes the earliest items (a subset sum on bitsets: `reach[i]` has bit c when items i.. can sum to exactly c)."""
    mask = (1 << (room + 1)) - 1
    reach = [0] * (len(costs) + 1)
    reach[-1] = 1
    for i in range(len(costs) - 1, -1, -1):
        reach[i] = (reach[i + 1] | (reach[i + 1] << costs[i])) & mask
    target = reach[0].bit_length() - 1
    chosen = []
    for i, cost in enumerate(costs):
        if cost <= target and reach[i + 1] >> (target - cost) & 1:
            chosen.append(i)
            target -= cost
    return chosen


def unit_batch(
    order: Sequence[str],
    places: Mapping[str, NodePlace],
    batch_by: BatchBy,
    gangs: Sequence[Gang],
    unavailable: set[str],
    size: int,
    budget_ceiling: int,
) -> UnitBatch:
    """The next batch of the pending nodes `order` (in the policy's order) with `batchBy` set: whole groups, else
    whole units of the first group; empty: wait for the budget."""
    units = units_of(order, places, batch_by)
    groups, busy = groups_of(units, gangs)
    first = {n: i for i, n in enumerate(order)}
    groups.sort(key=lambda g: (any(u in busy for u in g), first[units[g[0]][0]]))

    def cost(nodes: Sequence[str]) -> int:
        return sum(1 for n in nodes if n not in unavailable)

    # The strategy's size, rounded up to whole units in the order they would be taken.
    rounded = 0
    for u in (u for g in groups for u in g):
        if rounded >= size:
            break
        rounded += len(units[u])
    room = min(rounded, max(0, budget_ceiling - len(unavailable)))
    group_nodes = [[n for u in g for n in units[u]] for g in groups]
    taken = [u for i in _best_subset([cost(nodes) for nodes in group_nodes], room) for u in groups[i]]
    if not taken and groups:  # no whole group fits: whole units of the first one, in order
        for u in groups[0]:
            if cost(units[u]) <= room:
                taken.append(u)
                room -= cost(units[u])
    chosen = {n for u in taken for n in units[u]}
    return UnitBatch(
        nodes=[n for n in order if n in chosen],
        units={u: units[u] for u in sorted(taken, key=lambda u: first[units[u][0]])},
        gangs=sorted(g.id for g in gangs if not g.disrupted and chosen.intersection(g.nodes)),
    )


def oversized_unit(
    compartment: str, members: Sequence[str], places: Mapping[str, NodePlace], batch_by: BatchBy, budget_ceiling: int
) -> str | None:
    """Why a batch can never take a unit of `members` whole (it has more nodes than the ceiling); None: all fit."""
    kind = UNIT_NAMES[batch_by]
    for unit, nodes in units_of(members, places, batch_by).items():
        if len(nodes) > budget_ceiling:
            return (
                f"compartment {compartment!r}: {kind} {unit} has {len(nodes)} nodes, more than the compartment's "
                f"ceiling of {budget_ceiling}; batchBy {batch_by} takes every {kind} whole: raise the "
                f"compartment's budget to at least {len(nodes)} nodes, or set batchBy: none"
            )
    return None


def own_domain_note(places: Sequence[NodePlace], clique_label: str = CLIQUE_LABEL) -> str | None:
    """A node without the clique label is an NVLink domain of its own; say which, as the plan and status do."""
    alone = sorted(p.node for p in places if p.own_domain)
    if not alone:
        return None
    shown = ", ".join(alone[:OWN_DOMAINS_SHOWN]) + (f" and {len(alone) - OWN_DOMAINS_SHOWN} more"
                                                     if len(alone) > OWN_DOMAINS_SHOWN else "")  # fmt: skip
    return f"{len(alone)} nodes have no {clique_label} label, each its own NVLink domain: {shown}"


def topology_note(places: Sequence[NodePlace], batch_by: BatchBy, clique_label: str) -> str:
    """What a compartment's status says of its batches' units."""
    note = own_domain_note(places, clique_label) if batch_by == "nvlinkDomain" else None
    return f"batches take whole units: {UNIT_NAMES[batch_by]}s" + (f"; {note}" if note else "")
