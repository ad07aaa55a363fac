"""When a whole NVLink domain is remediated as one: pure decisions over what the sweep or the event path saw of the
nodes of one cluster (no I/O, no clock: the callers pass the times).

A domain is named by its rack key (activities/kube/topology.py `rack_key`: the rack label, else the NVLink domain),
which a fabric fault leaves in place. It escalates to one RackRemediation instead of a NodeRemediation per node when

- at least `share` of its nodes are unhealthy (and at least `domain_wide_nodes` of them: one sick node is its own
  remediation's), or
- the fault is domain-wide: at least `domain_wide_nodes` of its unhealthy nodes show a fabric sign within
  `domain_window` of each other, as the path first saw them: the clique label gone while the rack's other nodes (or
  the path's earlier view) show the domain, an NVLink XID, or a fabric condition.

A node with no rack key (no rack label and no clique label) never escalates. The sweep keeps counts per domain, not
node lists (`RackTally`); the event path counts its view of the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from pydantic import Field

from activities.kube.topology import OWN_DOMAIN_PREFIX, NodePlace, TopologyLabels, fault_domain, rack_key
from activities.models import StrictModel
from activities.node_health import NodeHealth
from activities.prometheus import XID_ERRORS, GpuFault
from activities.redfish import BmcRef
from workflows.remediation.policy import HealthChecks
from workflows.remediation.rack_models import DEFAULT_ESCALATION_SHARE, RackSettings

# NVIDIA's XID catalog: 74 an NVLink error; 144-150 the NVLink errors of Blackwell (149 NETIR_LINK_DOWN, 145 what the
# other GPUs of a domain report when one link goes down).
FABRIC_XIDS = [74, 144, 145, 146, 147, 148, 149, 150]
CLIQUE_GONE = "clique label gone"


class RackEscalation(StrictModel):
    """When the sweep and the event path remediate a node's whole NVLink domain instead of the node."""

    enabled: bool = Field(True, description="Escalate at all; false: every node gets its own NodeRemediation.")
    share: float = Field(DEFAULT_ESCALATION_SHARE, gt=0, le=1, description="A domain with at least this share of its "
                         "nodes unhealthy (and at least domain_wide_nodes of them) is remediated whole.")  # fmt: skip
    domain_wide_nodes: int = Field(2, ge=2, description="This many unhealthy nodes of a domain with a fabric sign "
                                   "within domain_window: the fault is domain-wide.")  # fmt: skip
    domain_window: timedelta = Field(timedelta(seconds=30), ge=timedelta(0), description="How close together the "
                                     "fabric faults must be first seen.")  # fmt: skip
    fabric_xids: list[int] = Field(default_factory=lambda: list(FABRIC_XIDS), description="dcgm-exporter XIDs that "
                                   "are a fabric sign (the sweep reads them).")  # fmt: skip
    fabric_conditions: list[str] = Field(default_factory=list, description="Conditions of `checks` (problem or GPU "
                                         "conditions) whose fault is a fabric sign, e.g. an NVLink condition a "
                                         "node problem detector writes.")  # fmt: skip
    topology: TopologyLabels = Field(default_factory=TopologyLabels, description="Which labels say where a node "
                                     "sits (the clique and rack labels are read with every node's health).")  # fmt: skip
    rack: RackSettings = Field(default_factory=RackSettings, description="How the RackRemediation it starts works; "
                               "the BMCs the path knows for the domain's nodes are passed on below `rack.bmcs`.")  # fmt: skip

    switch_trays: dict[str, list[BmcRef]] = Field(default_factory=dict, description="Each rack's NVLink switch "
                                                  "trays' BMCs, by rack key: its RackRemediation's switch_bmcs (a "
                                                  "rack missing here: rack.switch_bmcs).")  # fmt: skip

    def rack_for(self, rack: str) -> dict:
        """`rack`'s RackRemediation settings, its own switch trays in them."""
        settings = self.rack.model_dump()
        if rack in self.switch_trays:
            settings["switch_bmcs"] = [b.model_dump() for b in self.switch_trays[rack]]
        return settings

    def label_keys(self) -> list[str]:
        """The node labels the health reads need for the decision: where each node sits."""
        return [self.topology.clique, self.topology.rack] if self.enabled else []


class RackTally(StrictModel):
    """One domain's nodes as counted so far: counts, not names (a sweep of 10,000 nodes carries ~560 of these)."""

    nodes: int = 0
    unhealthy: int = 0
    domain: str = Field("", description="The NVLink domain its nodes with a clique label show.")

    def add(self, other: RackTally) -> None:
        self.nodes += other.nodes
        self.unhealthy += other.unhealthy
        self.domain = self.domain or other.domain


class FaultyNode(StrictModel):
    """An unhealthy node as the escalation sees it."""

    node: str
    place: NodePlace
    fabric: list[str] = Field(default_factory=list, description="Its fabric signs but the clique label's (XIDs, "
                              "conditions): `fabric_signs`.")  # fmt: skip
    seen_at: datetime = Field(description="When the path first saw its fault (the sweep: when it read the node).")


class Escalation(StrictModel):
    """A domain to remediate whole."""

    rack: str = Field(description="Its rack key: the RackRemediation's `domain` and ID.")
    domain: str = Field("", description="The NVLink domain its nodes show (or `rack:<rack>` when none does now).")
    nodes: list[str] = Field(description="Its unhealthy nodes, name order.")
    reason: str


def tally(nodes: Iterable[tuple[NodePlace, bool]]) -> dict[str, RackTally]:
    """Counts per rack key of (place, unhealthy) pairs; nodes without a rack key are left out."""
    out: dict[str, RackTally] = {}
    for place, unhealthy in nodes:
        key = rack_key(place)
        if key is None:
            continue
        seen = out.setdefault(key, RackTally())
        seen.add(RackTally(nodes=1, unhealthy=int(unhealthy), domain="" if place.own_domain else place.domain))
    return out


def fabric_signs(node: NodeHealth, settings: RackEscalation, checks: HealthChecks,
                 dcgm: list[GpuFault] | None = None) -> list[str]:  # fmt: skip
    """A node's fabric signs but the clique label's, which needs its rack's view (`escalations`)."""
    signs: list[str] = []
    for ctype in settings.fabric_conditions:
        seen = node.conditions.get(ctype)
        faulty_when = "False" if ctype in checks.gpu_conditions else "True"
        if seen is not None and seen.status == faulty_when:
            signs.append(f"{ctype}={faulty_when}")
    xids = sorted({int(f.value) for f in dcgm or [] if f.metric == XID_ERRORS} & set(settings.fabric_xids))
    return signs + [f"XID {xid}" for xid in xids]


def escalations(
    faulty: Iterable[FaultyNode],
    tallies: Mapping[str, RackTally],
    settings: RackEscalation,
    known: Mapping[str, str] | None = None,
) -> list[Escalation]:
    """The domains to remediate whole, rack key order. `faulty`: the cluster's unhealthy nodes (the sweep: those it
    would remediate); `tallies`: every node of the cluster counted per rack key; `known`: rack -> NVLink domain as
    the path saw it earlier (a fault that hides every clique label of a rack at once hides it from `tallies`)."""
    if not settings.enabled:
        return []
    by_rack = {**(known or {}), **{key: t.domain for key, t in tallies.items() if t.domain}}
    groups: dict[str, list[FaultyNode]] = {}
    for node in faulty:
        key = rack_key(node.place)
        if key is not None:
            groups.setdefault(key, []).append(node)
    out: list[Escalation] = []
    for key, nodes in sorted(groups.items()):
        seen = tallies.get(key) or RackTally()
        total, unhealthy = max(seen.nodes, len(nodes)), max(seen.unhealthy, len(nodes))
        reasons: list[str] = []
        if unhealthy >= settings.domain_wide_nodes and unhealthy / total >= settings.share:
            reasons.append(f"{unhealthy} of {total} nodes unhealthy (share {settings.share:g})")
        if fabric := _fabric_fault(nodes, by_rack, settings):
            reasons.append(f"fabric fault: {fabric}")
        if reasons:
            domain = next(
                (d for n in nodes if not (d := fault_domain(n.place, by_rack)).startswith(OWN_DOMAIN_PREFIX)), ""
            )
            out.append(Escalation(rack=key, domain=domain, nodes=sorted(n.node for n in nodes),
                                  reason="; ".join(reasons)))  # fmt: skip
    return out


def _fabric_fault(nodes: list[FaultyNode], by_rack: Mapping[str, str], settings: RackEscalation) -> str:
    """What the domain-wide fabric fault is, counted over its nodes with a fabric sign, when at least
    `domain_wide_nodes` of them were first seen within `domain_window`; "" when none is."""
    signed: list[tuple[FaultyNode, list[str]]] = []
    for node in nodes:
        signs = list(node.fabric)
        if node.place.own_domain and node.place.rack and by_rack.get(node.place.rack):
            signs.insert(0, CLIQUE_GONE)
        if signs:
            signed.append((node, signs))
    times = sorted(node.seen_at for node, _ in signed)
    k = settings.domain_wide_nodes
    if not any(times[i + k - 1] - times[i] <= settings.domain_window for i in range(len(times) - k + 1)):
        return ""
    counts: dict[str, int] = {}
    for _, signs in signed:
        for sign in signs:
            counts[sign] = counts.get(sign, 0) + 1
    return "; ".join(f"{sign} {'from' if sign == CLIQUE_GONE else 'on'} {n} node{'s' * (n != 1)}"
                     for sign, n in counts.items())  # fmt: skip
