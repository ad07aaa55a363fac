"""The Kubernetes node a burn-in's server is: refused while in service, or taken out of service and back.

A burn-in power-cycles its server. When the server is a Kubernetes node (`ServerTarget.kubernetes`), the burn-in
first reads the node. A node in service (schedulable: nobody cordoned it) is refused with `NodeInService`, naming
the node and how to take it out of service, unless ``take_out_of_service`` asks the burn-in to do it itself: a
lease from the cluster's disruption budget (workflows/budget/disruption_budget.py), a cordon in the run's name, and a
drain (workflows/maintenance/drain.py), all before the first power change. After a pass, once the node is back on its disk
and Ready with a new boot ID, the cordon goes and the lease is returned; after a failure the node stays cordoned,
quarantined with the burn-in's reason (activities/node_health.py `quarantine_node`: annotation and taint), and the
lease is returned (the cordon keeps the node counted as out of service). A node someone else cordoned stays theirs.
A firmware update (workflows/firmware/) takes its node out and back the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from activities.kube.activities import KubeActivities
from activities.kube.models import CordonHandOver, CordonRequest, DrainSettings, NodeInfo, NodeRef, RebootWait
from activities.kube.validators import validate_object_name
from activities.models import StrictModel, SystemIdentity
from activities.node_health import NodeHealthActivities, QuarantineRequest
from workflows.budget.budget import Budget
from workflows.budget.leases import Lease, acquire_lease, release_lease
from workflows.common.call_options import API_CALL
from workflows.maintenance.drain import Drain, DrainProgress

# Runs started before a burn-in knew its Kubernetes node read no node: they replay without these steps.
NODE_GUARD_PATCH = "burn-in-kubernetes-node"

# The burn-in phases (workflows.burnin.Phase) that taking the node out and back in enters.
NodePhase = Literal["checking-node", "waiting-for-budget", "cordoning", "draining", "waiting-for-pods-to-terminate",
                    "quarantining", "waiting-for-node", "uncordoning"]  # fmt: skip


class OutOfService(StrictModel):
    """How a server's Kubernetes node goes out of service, in whichever cluster: a firmware campaign
    (workflows/campaign/firmware_campaign.py) gives every cluster's nodes the same."""

    take_out_of_service: bool = Field(
        False, description="Lease the node from the cluster's disruption budget, cordon and drain it before the "
        "power cycle, uncordon it after a pass (a failure leaves it cordoned with the reason). Without it, a node "
        "in service is refused.",
    )  # fmt: skip
    drain: DrainSettings = Field(default_factory=DrainSettings)
    disruption_budget: Budget | None = Field(
        None, description="This run's own budget: its leases stay within it, inside the cluster's (an operator's)."
    )


class KubernetesNode(OutOfService):
    """The Kubernetes node the server is, so the burn-in never power-cycles it while it is in service."""

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    node: str | None = Field(None, description="Node name; default the server's name.")

    _cluster = field_validator("cluster")(validate_object_name)

    @field_validator("node")
    @classmethod
    def _node(cls, value: str | None) -> str | None:
        return None if value is None else validate_object_name(value)


class BurnInNodeStatus(DrainProgress):
    node: str
    cluster: str
    cordoned_by_us: bool = False
    cordon_holder: str | None = None
    lease: str | None = None
    note: str = ""


class NodeService:
    """One burn-in's node: `take_out()` before the first power change, `back_in()` after the verdict.

    `operation` names what takes the node out (a burn-in, a firmware update) in its cordon, lease and notes."""

    def __init__(self, ref: KubernetesNode, server: str, enter: Callable[[NodePhase, str], None],
                 operation: str = "burn-in") -> None:  # fmt: skip
        self.ref, self.operation, self.server = ref, operation, server
        self.status = BurnInNodeStatus(node=ref.node or server, cluster=ref.cluster)
        self._enter = enter
        self._node_ref = NodeRef(cluster=ref.cluster, node=self.status.node)

    @property
    def _cordon(self) -> CordonRequest:
        return CordonRequest(cluster=self.ref.cluster, node=self.status.node, owner=workflow.info().workflow_id,
                             reason=f"{self.operation} ({workflow.info().workflow_id})")  # fmt: skip

    async def _inspect(self) -> NodeInfo:
        return await workflow.execute_activity_method(
            KubeActivities.inspect_node, self._node_ref, **API_CALL, summary=f"inspect node {self.status.node}"
        )

    async def take_out(self, system: SystemIdentity | None = None) -> None:
        """Out of service before the first write; with `system` (the BMC's ComputerSystem), first refused unless
        the node is that machine."""
        s, ref = self.status, self.ref
        self._enter("checking-node", f"Kubernetes node {s.node} in {ref.cluster}")
        info = await self._inspect()
        if system is not None and not system.same_uuid(info.system_uuid):
            raise self._other_machine(info, system)
        if not ref.take_out_of_service:
            if not info.unschedulable:
                raise self._in_service(info)
            s.cordon_holder = info.cordoned_by or "unknown"
            s.note = f"node {s.node} is cordoned by {s.cordon_holder}: out of service"
            return
        self._enter("waiting-for-budget", f"lease on {s.node} from the disruption budget of {ref.cluster}")

        def waiting(lease: Lease) -> None:
            self._enter("waiting-for-budget", f"{lease.id}: queued #{lease.position}; {lease.note}")

        lease = await acquire_lease(ref.cluster, s.node, reason=self.operation, budget=ref.disruption_budget,
                                    waiting=waiting)  # fmt: skip
        s.lease = lease.id if lease else None
        self._enter("cordoning", s.node)
        held = await workflow.execute_activity_method(KubeActivities.cordon_node, self._cordon, **API_CALL,
                                                      summary=f"cordon {s.node}")  # fmt: skip
        s.cordoned_by_us, s.cordon_holder = held.owned, held.holder
        self._enter("draining", s.node)
        await Drain(ref.cluster, s.node, ref.drain, s, stopping=lambda: False,
                    changed=lambda: self._enter("draining", f"{len(s.evicted)}/{s.to_evict} pods evicted"),
                    terminating=lambda: self._enter("waiting-for-pods-to-terminate", s.node)).run()  # fmt: skip

    def _other_machine(self, info: NodeInfo, system: SystemIdentity) -> ApplicationError:
        s = self.status
        return ApplicationError(
            f"server {self.server}'s BMC reports system UUID {system.uuid or '(none)'} (serial "
            f"{system.serial or '(none)'}), but Kubernetes node {s.node} in {self.ref.cluster} reports systemUUID "
            f"{info.system_uuid or '(none)'}: they are not the same machine, so the {self.operation} would reset "
            f"one server while another node is taken out of service. Refused before any change; correct the "
            f"input's server.bmc or server.kubernetes.node",
            type="ServerIdentityMismatch", non_retryable=True,
        )  # fmt: skip

    def _in_service(self, info: NodeInfo) -> ApplicationError:
        s, ref = self.status, self.ref
        take_out = json.dumps({"cluster": ref.cluster, "node": s.node, "reason": self.operation,
                               "drain": {"delete_emptydir_data": True}})  # fmt: skip
        return ApplicationError(
            f"{s.node} is a Kubernetes node in service in {ref.cluster} ({'Ready' if info.ready else 'NotReady'}, "
            f"schedulable): a {self.operation} resets it. Take it out of service first (`millwright start "
            f"NodeMaintenance --input - <<<'{take_out}'`), or set server.kubernetes.take_out_of_service: true to have "
            f"the {self.operation} lease, cordon and drain it itself (and uncordon it after a pass)",
            type="NodeInService", non_retryable=True,
        )  # fmt: skip

    async def before_disk_boot(self) -> str | None:
        """The node's boot ID before the burn-in boots it back to its disk (the reboot to wait for)."""
        return (await self._inspect()).boot_id if self.status.cordoned_by_us else None

    async def back_in(self, passed: bool, reason: str, boot_id: str | None, boot_timeout: timedelta,
                      rebooted: bool = True) -> None:  # fmt: skip
        """After the verdict: uncordon a passed node once it is back (Ready, new boot ID; at once when the work did
        not reboot it, `rebooted` false); quarantine a failed one."""
        s = self.status
        if not s.cordoned_by_us:
            return
        if not passed:
            self._enter("quarantining", s.node)
            await workflow.execute_activity_method(
                NodeHealthActivities.quarantine_node,
                QuarantineRequest(cluster=self.ref.cluster, node=s.node, owner=self._cordon.owner, reason=reason),
                **API_CALL, summary=f"quarantine {s.node}")  # fmt: skip
            s.note = f"node {s.node} left cordoned and quarantined: {reason}"
        elif boot_id is not None or not rebooted:
            if boot_id is not None:
                await self.wait_rebooted(boot_id, boot_timeout)
            self._enter("uncordoning", s.node)
            done = await workflow.execute_activity_method(KubeActivities.uncordon_node, self._cordon, **API_CALL,
                                                          summary=f"uncordon {s.node}")  # fmt: skip
            s.note = (
                f"node {s.node}: drained ({len(s.evicted)} pods evicted) for the {self.operation}, back in service "
                f"({done.note})"
            )
        else:
            s.note = f"node {s.node} left cordoned: the {self.operation} did not boot the server back to its disk"
        if s.lease is not None:
            await release_lease(
                self.ref.cluster, s.node, reason=f"{self.operation} " + ("passed" if passed else "failed")
            )
            s.lease = None

    async def hand_over(self, to: str, reason: str) -> bool:
        """After a failure: pass our cordon to the run `to` (it takes the node on from here) and return the lease;
        False when the cordon is not ours to pass."""
        s = self.status
        passed = CordonHandOver(cluster=self.ref.cluster, node=s.node, owner=self._cordon.owner, reason=reason, to=to)
        held = await workflow.execute_activity_method(KubeActivities.hand_over_cordon, passed, **API_CALL,
                                                      summary=f"hand {s.node}'s cordon to {to}")  # fmt: skip
        if not held.owned:
            return False
        s.cordoned_by_us, s.cordon_holder, s.note = False, to, f"node {s.node} handed to {to}: {reason}"
        if s.lease is not None:
            await release_lease(self.ref.cluster, s.node, reason=f"{self.operation} handed the node to {to}")
            s.lease = None
        return True

    async def wait_rebooted(self, boot_id: str, boot_timeout: timedelta) -> None:
        """Until the node is Ready with a boot ID other than `boot_id` (back from the reset)."""
        s = self.status
        self._enter("waiting-for-node", f"{s.node} Ready with a new boot ID")
        await workflow.execute_activity_method(
            KubeActivities.wait_node_rebooted,
            RebootWait(cluster=self.ref.cluster, node=s.node, previous_boot_id=boot_id,
                       timeout_seconds=boot_timeout.total_seconds()),
            start_to_close_timeout=boot_timeout + timedelta(minutes=1), heartbeat_timeout=timedelta(seconds=30),
            retry_policy=API_CALL["retry_policy"], summary=f"wait for {s.node} to be back",
        )  # fmt: skip
