"""A fleet firmware update's NVLink domains: held out of service until each reads back one firmware set.

With `batch_by: nvlinkDomain` (workflows/firmware/fleet.py) a tray's `FirmwareUpdate` does not return its node to
service: installed, read back (and validated), back from its reset, it hands its cordon to the fleet
(`hand_node_to`) and returns its lease, the cordon keeping the node counted out of service by the budget. Once
every server of a domain is done, the fleet settles the domain: when every server is on the bundle and the
versions read back agree (workflows/firmware/waves.py `domain_verdict`) it lifts the cordon of every node it holds
there, all together; otherwise those nodes stay cordoned and are quarantined in the fleet's name with the reason,
and the domain is held out. A later run of the same fleet (its workflow ID owns those cordons) holds them again
from the node list it reads first, so running it again once the failed tray is fixed returns the domain.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from pydantic import Field
from temporalio import workflow

from activities.kube.activities import KubeActivities
from activities.kube.models import CordonRequest, NodeRef
from activities.models import StrictModel
from activities.node_health import NodeHealthActivities, QuarantineRequest
from workflows.common.call_options import API_CALL
from workflows.common.endpoints import Endpoints, kubernetes_api
from workflows.firmware.bundle import FirmwareBundle
from workflows.firmware.waves import domain_verdict


class DomainHeldOut(StrictModel):
    """An NVLink domain the fleet keeps out of service: not on one firmware set."""

    domain: str
    nodes: list[str] = Field(description="Its nodes the fleet keeps cordoned and quarantined in its own name (a "
                             "failed server's node is its FirmwareUpdate's, quarantined by that run).")  # fmt: skip
    reason: str = Field(description="Which servers are not on the bundle and why, or which versions differ.")


class DomainHold:
    """The nodes a fleet holds for their domains (`hold` as a server's update hands one over, or as the node list
    shows one an earlier run of the fleet kept), the versions its servers read back (`read_back`), and each
    domain's end (`settle`, once all its servers are done)."""

    def __init__(self, bundle: FirmwareBundle, calls: Endpoints) -> None:
        self._targets = [t for c in bundle.components for t in c.inventory_ids]
        self._bundle_name, self._calls = bundle.name, calls
        self.nodes: dict[str, NodeRef] = {}  # server -> its node, cordoned in the fleet's name until its domain settles
        self.lift: set[str] = set()  # servers whose node an earlier run of the fleet or of its update quarantined
        self.versions: dict[str, dict[str, str]] = {}
        self.settled: set[str] = set()
        self.held_out: list[DomainHeldOut] = []

    def hold(self, server: str, node: NodeRef) -> None:
        self.nodes[server] = node

    def read_back(self, server: str, versions: Mapping[str, str]) -> None:
        """The versions `server`'s update read last (the bundle's inventory IDs)."""
        self.versions[server] = {t: versions.get(t, "(missing)") for t in self._targets}

    async def settle(self, domain: str, states: Mapping[str, str], reasons: Mapping[str, str]) -> DomainHeldOut | None:
        """`domain`'s servers (`states`, `reasons`) are all done: the nodes held for it go back in service
        together when it is on one firmware set (None); else they stay out, quarantined, and the domain is held
        out (returned). None too for a domain the run neither changed nor holds anything of."""
        self.settled.add(domain)
        held = {server: self.nodes.pop(server) for server in states if server in self.nodes}
        why = domain_verdict(states, {s: self.versions.get(s, {}) for s in states}, reasons)
        if why is None:
            await asyncio.gather(*(self._release(server, node) for server, node in held.items()))
            return None
        if not held and not any(state in ("updated", "failed") for state in states.values()):
            return None
        reason = f"firmware {self._bundle_name}: NVLink domain {domain} held out of service by {self._owner}: {why}"
        await asyncio.gather(*(self._keep_out(node, reason) for node in held.values()))
        out = DomainHeldOut(domain=domain, nodes=[n.node for n in held.values()], reason=reason)
        self.held_out.append(out)
        return out

    @property
    def _owner(self) -> str:
        return workflow.info().workflow_id

    async def _release(self, server: str, node: NodeRef) -> None:
        """Back in service: a quarantine an earlier run left first (the node still cordoned), then our cordon."""
        if server in self.lift:
            lifted = QuarantineRequest(cluster=node.cluster, node=node.node, owner=self._owner,
                                       reason="its NVLink domain is on one firmware set")  # fmt: skip
            await self._calls.execute(NodeHealthActivities.release_quarantine, lifted, **API_CALL,
                                      endpoint=kubernetes_api(node.cluster), summary=f"lift {node.node}'s quarantine")  # fmt: skip
        await self._calls.execute(
            KubeActivities.uncordon_node, CordonRequest(cluster=node.cluster, node=node.node, owner=self._owner),
            **API_CALL, endpoint=kubernetes_api(node.cluster), summary=f"uncordon {node.node}",
        )  # fmt: skip

    async def _keep_out(self, node: NodeRef, reason: str) -> None:
        kept = QuarantineRequest(cluster=node.cluster, node=node.node, owner=self._owner, reason=reason)
        await self._calls.execute(NodeHealthActivities.quarantine_node, kept, **API_CALL,
                                  endpoint=kubernetes_api(node.cluster), summary=f"quarantine {node.node}")  # fmt: skip
