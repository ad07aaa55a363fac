"""A disruption budget's limits in the units a fault or a restart takes whole: NVLink domains with any node out of
service, and gangs of GPU work disrupted (docs/disruption-budget.md, "Limits in NVLink domains and gangs").

Pure: the lease book (workflows/budget/book.py `grant`) asks `UnitsOut.wait` about each request that would take a
node out of service, and takes the node's units on a grant; where a node sits and which gangs it runs come from the
entity's cluster read (activities/kube/rollout_activities.py `node_availability`, asked with topology label keys).
"""

from __future__ import annotations

from pydantic import Field

from activities.kube.models import NodeAvailability
from activities.kube.topology import NodePlace, TopologyLabels, place_of
from activities.models import StrictModel
from workflows.budget.leases import Lease


class UnitLimits(StrictModel):
    """Limits beside the node count; unset: no such limit."""

    nvlink_domains: int | None = Field(None, ge=1, description="NVLink domains with any node out of service at once.")
    gangs: int | None = Field(None, ge=1, description="Gangs of GPU work disrupted at once.")
    topology: TopologyLabels = Field(
        default_factory=TopologyLabels, description="The node labels that say where a node sits (its NVLink domain)."
    )

    @property
    def any(self) -> bool:
        return self.nvlink_domains is not None or self.gangs is not None

    def text(self) -> str:
        return ", ".join([f"{self.nvlink_domains} NVLink domains"] * (self.nvlink_domains is not None) +
                         [f"{self.gangs} gangs"] * (self.gangs is not None))  # fmt: skip


def place_in(avail: NodeAvailability, node: str) -> NodePlace:
    """Where the read says `node` sits; a node it could not place (none of that name) is a domain of its own."""
    return avail.places.get(node) or place_of(node, {})


class UnitsOut:
    """The NVLink domains with nodes out of service and the gangs disrupted, at one read and the leases held."""

    def __init__(self, avail: NodeAvailability, leases: list[Lease]) -> None:
        self.avail = avail
        self.domains: dict[str, list[str]] = {}
        self.gangs: dict[str, str] = dict(avail.disrupted_gangs)
        for node in avail.unavailable:
            self._add_domain(place_in(avail, node).domain, node)
        for lease in leases:
            self.take(lease)

    def _add_domain(self, domain: str, node: str) -> None:
        nodes = self.domains.setdefault(domain, [])
        if node not in nodes:
            nodes.append(node)

    def gangs_of(self, lease: Lease) -> list[str]:
        """The gangs on the lease's node: those it ran when granted (a drain moves them off) and those it runs now."""
        return list(dict.fromkeys(lease.gangs + self.avail.gangs_on.get(lease.node, [])))

    def take(self, lease: Lease) -> None:
        """Count the leased node's domain and gangs as out."""
        self._add_domain(lease.domain or place_in(self.avail, lease.node).domain, lease.node)
        for gang in self.gangs_of(lease):
            self.gangs.setdefault(gang, f"runs on {lease.node}, leased to {lease.holder}")

    def wait(self, lease: Lease, limits: UnitLimits) -> str | None:
        """Why taking the lease's node out of service must wait for a limit, or None when every limit allows it.
        The caller asks only about a node not out of service yet."""
        place = place_in(self.avail, lease.node)
        domains = limits.nvlink_domains
        if domains is not None and place.domain not in self.domains and len(self.domains) + 1 > domains:
            where = (f"has no {limits.topology.clique} label: its own NVLink domain" if place.own_domain
                     else f"is in domain {place.domain}")  # fmt: skip
            return (f"waiting: {len(self.domains)} of {domains} allowed NVLink domains have nodes out of service "
                    f"({lease.node} {where})")  # fmt: skip
        if limits.gangs is not None:
            new = [g for g in self.gangs_of(lease) if g not in self.gangs]
            if new and len(self.gangs) + len(new) > limits.gangs:
                return (f"waiting: {len(self.gangs)} of {limits.gangs} allowed gangs disrupted ({lease.node} runs "
                        f"{', '.join(new)})")  # fmt: skip
        return None

    def record(self, lease: Lease) -> None:
        """On a grant: the lease keeps its node's domain and gangs, so that they count while it is held even once
        a drain moved the gang's pods away; then they count as out."""
        lease.domain = place_in(self.avail, lease.node).domain
        lease.gangs = self.gangs_of(lease)
        self.take(lease)
