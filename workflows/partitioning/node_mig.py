"""NodeMigReconfigure: one node moved to a MIG layout, as a rollout moves a node (workflows/rollout/node_update.py).

read the node (already at the layout: done, nothing written) → lease from the cluster's disruption budget (its
batch's, or its own) → cordon, its state `in_progress`, the drain planned (one local activity, the rollout's
`start_node_update`) → drain the pods that use GPUs (workflows/maintenance/drain.py: evictions, so
PodDisruptionBudgets hold) → set `nvidia.com/mig.config` (refused while a GPU pod still runs) → wait for mig-manager's
`success` and the layout's resources on the node → the validation gate when asked → uncordon, state `complete`, the
lease returned.

Every write follows the one before it in the history, so a worker killed anywhere resumes at that step: the label is
never set before the drain finished. A node mig-manager fails, or whose state stays missing or `pending` past the
bound, or whose resources do not match, stays cordoned and `erroring` with the reason on the node
(`millwright.dev/rollout` annotation), keeping its lease as a rollout's erroring node does.

History events (W = a workflow task, 3 events): started 1 and W; the read 1 (local); the start 1 (local); the relabel
1 (local); the wait for mig-manager 3 + W; the finish 1 (local); the lease's release 1; completed 1: 16 with no pod to
evict (node_mig_reconfigure.json: 39, with one pod evicted after its PodDisruptionBudget refused once). Each pod
evicted adds its eviction (3, and a W unless evictions share one) and the wait for the pods to go 3 + W once; a node
already at its layout costs 6, and 1 more to return the lease its batch took.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from activities.kube.activities import KubeActivities
from activities.kube.mig import MigActivities, MigConfigResult, MigConfigWait, MigConfigWrite, MigNodesRequest
from activities.kube.models import NodeRolloutState, NodeUpdateFinish, NodeUpdateStart
from workflows.budget.leases import SIGNAL_PATCH, Lease, acquire_lease, release_lease
from workflows.common.call_options import API_CALL, API_RETRY
from workflows.common.patches import decide_early
from workflows.maintenance.drain import Drain
from workflows.partitioning.layouts import layout_of, model_of
from workflows.partitioning.models import NodeMigInput, NodeMigResult, NodeMigStatus
from workflows.validation.gate import validate_node

HEARTBEAT = timedelta(seconds=30)


class NotApplied(Exception):
    """The node did not reach its layout, or failed validation: it stays cordoned, erroring."""


def _reason(seen: MigConfigResult, config: str, inp: NodeMigInput) -> str:
    c = inp.change
    why = {
        "failed": f"mig-manager failed to apply {config}: {seen.reason or 'no reason given'}",
        "missing": f"no nvidia.com/mig.config.state within {c.pending_timeout} of setting {config} (is mig-manager "
        "running on the node?)",
        "pending": f"nvidia.com/mig.config.state stayed pending for {c.pending_timeout} after setting {config}",
        "timed-out": f"mig-manager did not finish {config} within {c.reconfigure_timeout} (state {seen.state})",
        "capacity-mismatch": f"mig-manager reports success but the node advertises {seen.resources}",
        "config-changed": f"someone else changed the layout while it was applied: {seen.reason}",
    }
    return why.get(seen.outcome, seen.outcome)


@workflow.defn
class NodeMigReconfigure:
    @workflow.init
    def __init__(self, inp: NodeMigInput) -> None:
        self._inp = inp
        self._status = NodeMigStatus()

    @workflow.signal(description="Hold before the node is taken out of service; a node already out finishes.")
    def pause(self) -> None:
        self._status.paused = True

    @workflow.signal(description="Carry on after a pause.")
    def resume(self) -> None:
        self._status.paused = False

    @workflow.query(description="Where the node is: its step, the drain's progress, its lease.")
    def status(self) -> NodeMigStatus:
        return self._status

    def _step(self, step: str, details: str = "") -> None:
        self._status.step = step
        workflow.set_current_details(f"**{step}** {details}".strip())

    @workflow.run
    async def run(self, inp: NodeMigInput) -> NodeMigResult:
        c, node = inp.change, inp.node
        decide_early(SIGNAL_PATCH)  # the lease is asked for right after the read's local activity
        self._step("reading", f"{node}'s MIG labels and GPU resources")
        found = await workflow.execute_local_activity_method(
            MigActivities.mig_nodes, MigNodesRequest(cluster=c.cluster, nodes=[node]), **API_CALL,
            summary=f"read {node}")  # fmt: skip
        seen = next((n for n in found.nodes if n.name == node), None)
        result = NodeMigResult(node=node, outcome="erroring")
        if seen is None:
            result.reason = f"node {node} not found in {c.cluster}"
            return await self._untouched(result)
        result.previous, result.mig_state, result.resources = seen.config, seen.state, seen.resources
        model = model_of(seen.product)
        layout = layout_of(c.config, model) if model is not None else None
        if layout is None:  # the fleet run refuses this before any write; a child started alone reports it
            result.reason = f"GPU {seen.product or '(no nvidia.com/gpu.product label)'} has no MIG config {c.config}"
            return await self._untouched(result)
        expected = layout.resources(seen.gpus)
        if seen.config == c.config and seen.state == "success" and seen.resources == expected:
            result.outcome = "at-target"
            self._step("at-target", f"{node} already has {c.config}")
            return await self._untouched(result)
        await workflow.wait_condition(lambda: not self._status.paused)
        await self._lease()
        self._step("cordoning", node)
        start = NodeUpdateStart(cluster=c.cluster, node=node, rollout=inp.by, cordon=True, drain=c.drain)
        started = await workflow.execute_local_activity_method(KubeActivities.start_node_update, start, **API_CALL,
                                                               summary=f"cordon {node}, plan its drain")  # fmt: skip
        try:
            self._step("draining", f"{len(started.drain.evict) if started.drain else 0} pods that use GPUs")
            await Drain(c.cluster, node, c.drain, self._status, stopping=lambda: False,
                        changed=lambda: self._step("draining", f"{len(self._status.evicted)}/{self._status.to_evict} "
                                                   "pods evicted"), every_planned_pod=True).run(started.drain)  # fmt: skip
            result.evicted = list(self._status.evicted)
            self._step("relabelling", f"nvidia.com/mig.config={c.config}")
            await workflow.execute_local_activity_method(
                MigActivities.set_mig_config, MigConfigWrite(cluster=c.cluster, node=node, config=c.config, by=inp.by),
                **API_CALL, summary=f"set {node}'s nvidia.com/mig.config={c.config}")  # fmt: skip
            self._step("waiting-for-mig-manager", f"nvidia.com/mig.config.state success and {expected} (at most "
                       f"{c.reconfigure_timeout}; missing or pending at most {c.pending_timeout})")  # fmt: skip
            waited: MigConfigResult = await workflow.execute_activity_method(
                MigActivities.await_mig_config,
                MigConfigWait(cluster=c.cluster, node=node, config=c.config, expected=expected,
                              timeout_seconds=c.reconfigure_timeout.total_seconds(),
                              pending_seconds=c.pending_timeout.total_seconds()),
                start_to_close_timeout=c.reconfigure_timeout + timedelta(minutes=1), heartbeat_timeout=HEARTBEAT,
                retry_policy=API_RETRY, summary=f"wait for mig-manager on {node}",
            )  # fmt: skip
            result.mig_state, result.resources, result.seconds = waited.state, waited.resources, waited.seconds
            if waited.outcome != "success":
                raise NotApplied(_reason(waited, c.config, inp))
            if c.validation is not None and c.validation.enabled:
                self._step("validating", node)
                settings = c.validation.model_copy(update={"expected_mig": layout.mig_enabled})
                result.validation = await validate_node(c.cluster, node, settings, by=inp.by, ordinal=inp.ordinal)
                if not result.validation.passed:
                    raise NotApplied(f"validation failed: {result.validation.reason}")
            self._step("uncordoning", node)
            finish = NodeUpdateFinish(cluster=c.cluster, node=node, rollout=inp.by, uncordon=True)
            await workflow.execute_local_activity_method(KubeActivities.finish_node_update, finish, **API_CALL,
                                                         summary=f"uncordon {node}")  # fmt: skip
        except (NotApplied, ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) and err.cause else err
            result.reason = str(cause)[:1000]
            self._step("erroring", result.reason)
            # The node keeps its cordon (and its lease, as a rollout's erroring node does): someone must look.
            state = NodeRolloutState(cluster=c.cluster, node=node, rollout=inp.by, state="erroring",
                                     stage=self._status.step, reason=result.reason)  # fmt: skip
            await workflow.execute_local_activity_method(KubeActivities.set_node_rollout_state, state, **API_CALL,
                                                         summary=f"mark {node} erroring")  # fmt: skip
            result.add(self._status)
            return result
        if self._status.lease is not None:
            await release_lease(c.cluster, node, reason="MIG layout applied, uncordoned")
            self._status.lease = None
        result.outcome = "reconfigured"
        result.add(self._status)
        self._step("reconfigured", f"{node}: {c.config}")
        return result

    async def _untouched(self, result: NodeMigResult) -> NodeMigResult:
        """The node was never taken out of service: the lease its batch took for it goes back."""
        if self._inp.lease is not None:
            await release_lease(self._inp.change.cluster, self._inp.node, reason=result.reason or result.outcome)
        return result

    async def _lease(self) -> Lease:
        inp = self._inp
        if inp.lease is not None:  # granted to its batch, which asked for all its nodes at once
            self._status.lease = inp.lease.id
            return inp.lease

        def waiting(lease: Lease) -> None:
            self._status.waiting_for = f"{lease.id}: queued #{lease.position}; {lease.note}"
            self._step("waiting-for-budget", self._status.waiting_for)

        self._step("waiting-for-budget", f"lease on {inp.node} from the disruption budget of {inp.change.cluster}")
        lease = await acquire_lease(inp.change.cluster, inp.node, reason=f"MIG {inp.change.config} ({inp.by})",
                                    budget=inp.change.disruption_budget, paused=lambda: self._status.paused,
                                    waiting=waiting)  # fmt: skip
        assert lease is not None  # never cancelled
        self._status.lease, self._status.waiting_for = lease.id, ""
        return lease
