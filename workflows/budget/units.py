"""A disruption budget's limits in the units a fault or a restart takes whole: NVLink domains with any node out of
service, and gangs of GPU work disrupted (docs/disruption-budget.md, "Limits in NVLink domains and gangs").

Pure: the lease book (workflows/budget/book.py `grant`) asks `UnitsOut.wait` about each request that would take a
node out of service, and takes the node's units on a grant; where a node sits and which gangs it runs come from the
entity's cluster read (activities/kube/rollout_activities.py `node_availability`, asked with topology label keys).
"""

from __future__ import annotations

import copy

from pydantic import Field

from activities.kube.models import NodeAvailability
from activities.kube.topology import (
    CLIQUE_LABEL,
    OWN_DOMAIN_PREFIX,
    RACK_PREFIX,
    NodePlace,
    TopologyLabels,
    domains_by_rack,
    fault_domain,
    place_of,
)
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


def shown(domain: str) -> bool:
    """The domain is a clique label's ClusterUUID, not a stand-in for a node or rack that showed none."""
    return not domain.startswith((OWN_DOMAIN_PREFIX, RACK_PREFIX))


class UnitsOut:
    """The NVLink domains with nodes out of service and the gangs disrupted, at one read and the leases held.

    A node whose clique label a fabric fault took off counts in its rack's NVLink domain (`fault_domain`): the
    rack's other nodes, or a lease granted while its node showed the label, say which; so a rack whose every node
    lost the label is one domain, not one per node."""

    def __init__(self, avail: NodeAvailability, leases: list[Lease]) -> None:
        self.avail = avail
        self.by_rack = domains_by_rack(avail.places.values())
        for lease in leases:  # a lease granted while its node showed the label knows its rack's domain
            rack = place_in(avail, lease.node).rack
            if rack and lease.domain and shown(lease.domain):
                self.by_rack.setdefault(rack, lease.domain)
        self.domains: dict[str, list[str]] = {}
        self.gangs: dict[str, str] = dict(avail.disrupted_gangs)
        for node in avail.unavailable:
            self._add_domain(self.domain_of(node), node)
        for lease in leases:
            self.take(lease)

    def domain_of(self, node: str) -> str:
        return fault_domain(place_in(self.avail, node), self.by_rack)

    def trial(self) -> UnitsOut:
        """A copy to try a group's nodes on, this one left as it is."""
        other = copy.copy(self)
        other.domains = {domain: list(nodes) for domain, nodes in self.domains.items()}
        other.gangs = dict(self.gangs)
        return other

    def _add_domain(self, domain: str, node: str) -> None:
        nodes = self.domains.setdefault(domain, [])
        if node not in nodes:
            nodes.append(node)

    def gangs_of(self, lease: Lease) -> list[str]:
        """The gangs on the lease's node: those it ran when granted (a drain moves them off) and those it runs now."""
        return list(dict.fromkeys(lease.gangs + self.avail.gangs_on.get(lease.node, [])))

    def take(self, lease: Lease) -> None:
        """Count the leased node's domain and gangs as out."""
        # Granted while its node showed no label: where it sits now (its label or its rack's may be back).
        domain = lease.domain if lease.domain and shown(lease.domain) else self.domain_of(lease.node)
        self._add_domain(domain, lease.node)
        for gang in self.gangs_of(lease):
            self.gangs.setdefault(gang, f"runs on {lease.node}, leased to {lease.holder}")

    def wait(self, lease: Lease, limits: UnitLimits) -> str | None:
        """Why taking the lease's node out of service must wait for a limit, or None when every limit allows it.
        The caller asks only about a node not out of service yet."""
        domain, domains = self.domain_of(lease.node), limits.nvlink_domains
        if domains is not None and domain not in self.domains and len(self.domains) + 1 > domains:
            return (f"waiting: {len(self.domains)} of {domains} allowed NVLink domains have nodes out of service "
                    f"({lease.node} {self._where(lease.node, limits.topology.clique)})")  # fmt: skip
        if limits.gangs is not None:
            new = [g for g in self.gangs_of(lease) if g not in self.gangs]
            if new and len(self.gangs) + len(new) > limits.gangs:
                return (f"waiting: {len(self.gangs)} of {limits.gangs} allowed gangs disrupted ({lease.node} runs "
                        f"{', '.join(new)})")  # fmt: skip
        return None

    def _where(self, node: str, clique: str) -> str:
        place, domain = place_in(self.avail, node), self.domain_of(node)
        if not place.own_domain:
            return f"is in domain {domain}"
        if domain == place.domain:
            return f"has no {clique} label: its own NVLink domain"
        if domain.startswith(RACK_PREFIX):
            return f"has no {clique} label: counted with its rack {place.rack}, none of whose nodes shows one"
        return f"has no {clique} label: its rack {place.rack} is in domain {domain}"

    def describe(self, node: str) -> str:
        """Where `node` sits, for the `state` view: its labels' place, or the domain its rack gave it."""
        place, domain = place_in(self.avail, node), self.domain_of(node)
        if domain == place.domain:
            return place.describe()
        return f"no {CLIQUE_LABEL} label: NVLink domain {domain} by its rack; rack {place.rack}; block {place.block or '-'}"

    def record(self, lease: Lease) -> None:
        """On a grant: the lease keeps its node's domain and gangs, so that they count while it is held even once
        a drain moved the gang's pods away; then they count as out."""
        lease.domain = self.domain_of(lease.node)
        lease.gangs = self.gangs_of(lease)
        self.take(lease)
