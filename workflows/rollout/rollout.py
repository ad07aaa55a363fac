"""Rollout: a progressive host-OS rollout over a cluster, NodeWright's DeploymentPolicy as a workflow.

Rollout (one per change, `rollout/<cluster>/<name>`) runs the fleet engine (workflows/rollout/compartments.py:
survey, compartments, gates, budget, batches, soak, continue-as-new) with NodeUpdate as the per-node work, built
from the spec's packages (`_template`).
RolloutBatch (one per batch, of any fleet run) starts the per-node child its `NodeWork` names, `maxInFlight` at a
time, and continues as new between chunks of a very large batch. When the work takes nodes out of service, it asks
the cluster's disruption budget for its nodes' leases (each lease held by the node's child, which it starts with
the lease; see workflows/budget/disruption_budget.py), so nodes of every kind of holder share the cluster's one budget.

The budget is a hard cap: before each batch the engine counts the compartment's nodes that are out of service for
any reason (cordoned by anyone, NotReady) and admits at most `ceiling - unavailable` nodes. Failed nodes stay
cordoned, so they keep counting.

RolloutBatch lives with Rollout: a new run re-imports its own workflow module and those of the children it names,
and tests/test_sandbox.py holds a Rollout run to two (this one and workflows/rollout/node_update.py); a module of
the batch's own would be a third.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow

from workflows.budget.budget import Budget, ceiling
from workflows.budget.leases import SIGNAL_PATCH, Lease, acquire_lease, release_lease
from workflows.common import priorities
from workflows.common.base import history_is_long
from workflows.common.patches import decide_early
from workflows.maintenance.drain import DEADLINE_TIMER
from workflows.maintenance.gang_drains import GangDrains
from workflows.rollout.batching import coalesce_interrupts, compartment_budget, package_order, plan, window_open
from workflows.rollout.cluster_reads import read_gangs
from workflows.rollout.compartments import HISTORY_LIMIT, Compartments
from workflows.rollout.fleet_controls import FleetControls
from workflows.rollout.models import (
    BatchInput,
    BatchNode,
    BatchResult,
    NodeOutcome,
    NodeUpdateInput,
    NodeUpdateResult,
    NodeUpdateStatus,
    NodeUpdateTemplate,
    NodeWork,
    PackageStep,
    RolloutResult,
)
from workflows.rollout.node_update import STAGES_HAND_BACK, START_WITH_STAGES, NodeSequence
from workflows.rollout.spec.admission import MaintenanceWindow
from workflows.rollout.spec.spec import RolloutInput
from workflows.rollout.state import BatchState
from workflows.rollout.windows import WINDOW_BY_TIMER, sleep_until_window
from workflows.validation.defaults import validation_for

# workflow.patched() id of batch planning (docs/rollout-batch-planning.md): membership re-read before each batch,
# erroring nodes retried, the priority order, resetBatchStateOnCompletion. Runs from before keep their fixed members.
PLANNING_PATCH = "rollout-batch-planning"
# The cluster's validation default, read once per rollout (its first run) when the spec gives no validation.
VALIDATION_DEFAULT_PATCH = "rollout-validation-default"
# A batch runs each node's update itself (NodeSequence) instead of a NodeUpdate child per node: a node costs its
# calls and no workflow of its own (docs/rollouts.md counts the events). Batches from before start children.
INLINE_PATCH = "rollout-batch-inline-nodes"
INLINE_WORK = "NodeUpdate"  # the per-node work a batch runs inline


# ---------------------------------------------------------------- RolloutBatch


@workflow.defn
class RolloutBatch:
    @workflow.init
    def __init__(self, inp: BatchInput) -> None:
        self._work = inp.work or node_update_work(inp.template)  # type: ignore[arg-type]  # one of them: BatchInput
        self._paused = False
        self._stopped = False
        self._running: dict[str, workflow.ChildWorkflowHandle] = {}
        self._inline: dict[str, NodeSequence] = {}  # nodes this batch updates itself
        self._waiting: dict[str, str] = {}  # node -> its place at the disruption budget
        self._window_by_timer = False  # WINDOW_BY_TIMER, decided at the start

    @workflow.signal(description="Start no more nodes; running nodes hold after their current stage.")
    async def pause(self) -> None:
        self._paused = True
        for node in self._inline.values():
            node.pause()
        await self._forward(self._work.pause_signal)

    @workflow.signal(description="Carry on after a pause.")
    async def resume(self) -> None:
        self._paused = False
        for node in self._inline.values():
            node.resume()
        await self._forward(self._work.resume_signal)

    @workflow.signal(description="Start no more nodes; running nodes finish.")
    def stop(self) -> None:
        self._stopped = True

    @workflow.query
    def running(self) -> list[str]:
        return sorted([*self._running, *self._inline])

    @workflow.query(description="Each node this batch updates itself now: its stage and package, drain progress, "
                    "stages done (a node run as a child answers its own `status`).")  # fmt: skip
    def nodes(self) -> dict[str, NodeUpdateStatus]:
        return {name: node.status for name, node in sorted(self._inline.items())}

    @workflow.query(description="Nodes waiting for the cluster's disruption budget, with their place.")
    def waiting_for_budget(self) -> dict[str, str]:
        return dict(sorted(self._waiting.items()))

    @workflow.run
    async def run(self, inp: BatchInput) -> BatchResult:
        work = self._work
        results = {n: r.model_dump(mode="json") for n, r in inp.results.items()} | inp.outputs
        todo = [n for n in inp.nodes if n.node not in results]
        slots = asyncio.Semaphore(inp.max_in_flight)
        not_started: list[str] = []
        # Runs from before SIGNAL_PATCH start their nodes without a lease: each NodeUpdate asks for its own.
        leased = work.lease_field is not None and workflow.patched(SIGNAL_PATCH)
        inline = work.workflow == INLINE_WORK and workflow.patched(INLINE_PATCH)
        if inline:  # a node's sequence decides it right after a local activity: here instead, for all of them
            decide_early(STAGES_HAND_BACK, START_WITH_STAGES, DEADLINE_TIMER)
        # Here, not when a window's timer fires: that may be in the activation of a node's local activity.
        self._window_by_timer = bool(inp.windows) and workflow.patched(WINDOW_BY_TIMER)

        async def one(n: BatchNode, together: GangDrains) -> None:
            try:
                await node(n, together)
            finally:
                together.settled(n.node)

        async def node(n: BatchNode, together: GangDrains) -> None:
            async with slots:
                lease = None
                while True:
                    await self._admit(inp.windows)
                    if self._stopped:
                        not_started.append(n.node)
                        return
                    if not leased:
                        break
                    lease = await self._lease(inp.windows, n.node, inline, together)
                    if lease is not None:
                        break
                if inline:
                    results[n.node] = await self._run_inline(n, lease, together)
                    return
                handle = await workflow.start_child_workflow(
                    work.workflow,
                    _child_input(work, n, lease),
                    id=f"{work.id_prefix}/{n.node}",
                    # The node's stages and drain inherit this (workflows/common/priorities.py).
                    priority=priorities.rollout(work.cluster),
                    static_summary=f"{n.node} in batch {inp.number} of {inp.compartment}",
                )
                self._running[n.node] = handle
                self._details()
                if self._paused and work.pause_signal:
                    await handle.signal(work.pause_signal)
                results[n.node] = await handle
                del self._running[n.node]
                self._details()

        # A sliding window over chunks of twice its size: between two chunks nothing runs,
        # and there the run may continue as new.
        chunk_size = 2 * inp.max_in_flight
        while todo:
            chunk, todo = todo[:chunk_size], todo[chunk_size:]
            # A gang on several nodes of the chunk is evicted from all of them at once (gang_drains.py).
            together = GangDrains([n.node for n in chunk], slots, lambda: self._inside_windows(inp.windows))
            await asyncio.gather(*(one(n, together) for n in chunk))
            if todo and not self._stopped and history_is_long(HISTORY_LIMIT):
                await workflow.wait_condition(workflow.all_handlers_finished)
                carried = {"nodes": todo, "work": work, "template": None, "results": {}, "outputs": results}
                workflow.continue_as_new(inp.model_copy(update=carried))
        not_started += [n.node for n in todo]
        return BatchResult(outputs=results, not_started=not_started)

    async def _run_inline(self, n: BatchNode, lease: Lease | None, together: GangDrains) -> dict[str, Any]:
        """The node's update, run by this batch; its result as a child's would be (JSON)."""
        node = self._inline[n.node] = NodeSequence(NodeUpdateInput.model_validate(_child_input(self._work, n, lease)),
                                                   together=together)  # fmt: skip
        self._details()
        if self._paused:
            node.pause()
        result = await node.run()
        del self._inline[n.node]
        self._details()
        return result.model_dump(mode="json")

    async def _lease(self, windows: list[MaintenanceWindow], node: str, inline: bool,
                     together: GangDrains) -> Lease | None:  # fmt: skip
        """The node's lease, held by this batch for a node it updates itself, else by the node's child-to-be; None
        when the batch is paused or stopped meanwhile (the request is withdrawn: a paused batch holds no place) or
        the grant comes outside the windows (returned)."""
        w = self._work
        holder = workflow.info().workflow_id if inline else f"{w.id_prefix}/{node}"

        def waiting(lease: Lease) -> None:
            self._waiting[node] = f"{lease.id}: queued #{lease.position}; {lease.note}"
            together.settled(node)  # its gang's other nodes do not wait for it: the budget may want them back first
            self._details()

        lease = await acquire_lease(w.cluster, node, holder=holder, reason=w.lease_reason, budget=w.budget,
                                    cancelled=lambda: self._stopped or self._paused, waiting=waiting)  # fmt: skip
        self._waiting.pop(node, None)
        self._details()
        if lease is not None and windows and not window_open(windows, workflow.now()):
            await release_lease(w.cluster, node, holder, "granted outside the maintenance windows")
            return None
        return lease

    def _details(self) -> None:
        workflow.set_current_details(
            f"{len(self._running) + len(self._inline)} nodes running, "
            f"{len(self._waiting)} waiting for the disruption budget"
        )

    async def _admit(self, windows: list[MaintenanceWindow]) -> None:
        """Wait while paused, and outside the maintenance windows: no node starts outside them."""
        opened = False  # the last wait for a window ended because its timer fired: open (WINDOW_BY_TIMER)
        while not self._stopped:
            if self._paused:
                await workflow.wait_condition(lambda: not self._paused or self._stopped)
                opened = False
                continue
            if windows and not opened and not window_open(windows, workflow.now()):
                opened = await sleep_until_window(windows, lambda: self._stopped or self._paused)
                opened = opened and self._window_by_timer
                continue
            return

    async def _inside_windows(self, windows: list[MaintenanceWindow]) -> None:
        """Wait until inside a maintenance window (at once without windows): nothing is evicted outside them."""
        while windows and not window_open(windows, workflow.now()):
            if await sleep_until_window(windows, lambda: False) and self._window_by_timer:
                return

    async def _forward(self, signal: str | None) -> None:
        if signal is None:
            return
        for handle in list(self._running.values()):
            await handle.signal(signal)


def _child_input(work: NodeWork, n: BatchNode, lease: Lease | None) -> dict[str, Any]:
    given: dict[str, Any] = {work.node_field: n.node}
    if work.ordinal_field:
        given[work.ordinal_field] = n.ordinal
    if work.lease_field and lease is not None:
        given[work.lease_field] = lease.model_dump(mode="json")
    return work.input | given


def node_update_work(template: NodeUpdateTemplate) -> NodeWork:
    """A rollout's per-node work: NodeUpdate, each node leased first when the update interrupts it."""
    return NodeWork(
        workflow="NodeUpdate",
        cluster=template.cluster,
        id_prefix=template.rollout,
        input={"template": template.model_dump(mode="json")},
        ordinal_field="ordinal",
        lease_field="lease" if template.interrupt is not None else None,
        budget=template.disruption_budget,
        lease_reason=f"rollout {template.rollout}",
        pause_signal="pause",
        resume_signal="resume",
    )


def node_update_outcome(result: Any) -> NodeOutcome:
    res = NodeUpdateResult.model_validate(result)
    return NodeOutcome(outcome=res.outcome, reason=res.reason, stages=res.stages, cost=res.cost())


# ---------------------------------------------------------------- Rollout


@workflow.defn
class Rollout(FleetControls):
    @workflow.init
    def __init__(self, inp: RolloutInput) -> None:
        self._inp = inp
        self._fleet = Compartments(
            inp,
            work=lambda: node_update_work(self._template()),
            read=node_update_outcome,
            phase="planning" if inp.dry_run else "surveying",
        )

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutResult:
        fleet = self._fleet
        if inp.dry_run:
            nodes = await fleet.survey()
            gangs = (await read_gangs(inp)).gangs
            fleet.phase = "planned"
            fleet.refresh()
            return RolloutResult(cluster=inp.cluster, name=inp.name, outcome="planned", plan=plan(nodes, inp, gangs))
        fleet.planning = workflow.patched(PLANNING_PATCH)
        if inp.checkpoint is None:
            # Once per rollout, before any node: carried in the input through continue-as-new, so never read again.
            validation = await validation_for(inp.cluster, inp.validation, VALIDATION_DEFAULT_PATCH)
            if validation is not inp.validation:
                self._inp = inp = inp.model_copy(update={"validation": validation})
            await fleet.start()
        if fleet.planning:
            self._reset_on_version_change()
        await fleet.run()
        if fleet.continues():
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(inp.model_copy(update={"checkpoint": fleet.carry()}))
        problems = fleet.finish()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return RolloutResult(
            cluster=inp.cluster,
            name=inp.name,
            outcome="aborted" if fleet.aborted else "completed",
            counts=fleet.counts(),
            problems=problems,
            compartments={name: cs.batch for name, cs in fleet.cp.compartments.items()},
            **fleet.cp.cost.cost().model_dump(),
        )

    def _reset_on_version_change(self) -> None:
        """resetBatchStateOnCompletion also resets on a version change: batch states carried from other versions."""
        cp, versions = self._fleet.cp, self._inp.package_versions()
        if cp.package_versions and cp.package_versions != versions and self._inp.resets_batch_state():
            for cs in cp.compartments.values():
                cs.batch, cs.completed = BatchState(), False
        cp.package_versions = versions

    def _template(self) -> NodeUpdateTemplate:
        inp = self._inp
        steps = [
            PackageStep(
                name=name,
                version=p.version,
                image=p.image,
                config=p.config_map,
                has_interrupt=p.interrupt is not None,
                stage_timeout=p.stage_timeout,
            )
            for name in package_order(inp.packages)
            for p in [inp.packages[name]]
        ]
        # Packages whose uninstall is applied are uninstalled, dependents first, with their interrupts coalesced.
        removing = {n for n, p in inp.packages.items() if p.uninstall.apply}
        interrupts = [p.interrupt for n, p in inp.packages.items() if p.interrupt is not None and n not in removing]
        uninstall_interrupts = [p.interrupt for n, p in inp.packages.items() if p.interrupt and n in removing]
        return NodeUpdateTemplate(
            cluster=inp.cluster,
            rollout=workflow.info().workflow_id,
            packages=[s for s in steps if s.name not in removing],
            interrupt=coalesce_interrupts(interrupts) if interrupts else None,
            uninstall=[s for s in reversed(steps) if s.name in removing],
            uninstall_interrupt=coalesce_interrupts(uninstall_interrupts) if uninstall_interrupts else None,
            allow_downgrade=inp.allow_downgrade,
            runtime_required=inp.runtime_required,
            auto_taint_new_nodes=inp.auto_taint_new_nodes,
            validation=inp.validation,
            drain=inp.drain_config.settings(),
            non_interrupt_selector=(
                inp.pod_non_interrupt_labels.to_selector_string() if inp.pod_non_interrupt_labels else None
            ),
            stage_retries=inp.stage_retries,
            reboot_timeout=inp.reboot_timeout,
            # The rollout's own budget, inside the cluster's: what this rollout alone may take out at once.
            disruption_budget=Budget(
                count=max(
                    1,
                    sum(
                        ceiling(compartment_budget(inp.deployment_policy, name), len(cs.members))
                        for name, cs in self._fleet.cp.compartments.items()
                    ),
                )
            ),
        )
