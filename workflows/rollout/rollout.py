"""Rollout: a progressive host-OS rollout over a cluster, NodeWright's DeploymentPolicy as a workflow.

Rollout (one per change, `rollout/<cluster>/<name>`)
  ├─ surveys the targeted nodes once and splits them into compartments;
  ├─ per compartment, concurrently: gates (pause, maintenance window, approval, batch gate)
  │   → budget check against the live cluster → one RolloutBatch child → evaluation
  │   (NodeWright's arithmetic, `workflows.rollout.batching`) → soak;
  └─ continues as new between batches before its history grows large.
RolloutBatch (one per batch) runs a NodeUpdate child per node, `maxInFlight` at a time,
and continues as new between chunks of a very large batch. It asks the cluster's disruption
budget for its nodes' leases in one request (each lease held by the node's NodeUpdate, which
it starts with the lease; see workflows/budget/disruption_budget.py), so nodes of every kind of
holder share the cluster's one budget.

The budget is a hard cap: before each batch the workflow counts the compartment's nodes
that are out of service for any reason (cordoned by anyone, NotReady) and admits at most
`ceiling - unavailable` nodes. Failed nodes stay cordoned, so they keep counting.

Longer than 600 lines because RolloutBatch lives with Rollout: a new run re-imports its own workflow module and
those of the children it names, and tests/test_sandbox.py holds a Rollout run to two (this one and
workflows/rollout/node_update.py); a module of the batch's own would be a third.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow

from activities.kube.activities import KubeActivities
from activities.kube.models import ConditionGate, NodePageRequest, UnavailableRequest
from activities.prometheus import PrometheusActivities, PrometheusQuery
from workflows.budget.budget import Budget, ceiling
from workflows.budget.leases import SIGNAL_PATCH, Lease, acquire_lease, release_lease
from workflows.common import priorities
from workflows.common import search_attributes as sa
from workflows.common.base import Progress, history_is_long, publish_phase
from workflows.common.call_options import API_CALL
from workflows.rollout.batching import (
    NODE_PRIORITY_LABEL,
    NodeSnapshot,
    admissible,
    assign_compartments,
    batch_order,
    coalesce_interrupts,
    compartment_budget,
    compartment_strategy,
    evaluate_batch,
    next_batch_size,
    next_window_open,
    package_order,
    plan,
    strategy_name,
    window_open,
)
from workflows.rollout.membership import MembershipChange, reconcile, retryable
from workflows.rollout.models import (
    ApproveRequest,
    BatchInput,
    BatchNode,
    BatchResult,
    BatchView,
    CompartmentPhase,
    CompartmentRequest,
    CompartmentView,
    NodeRequest,
    NodeUpdateInput,
    NodeUpdateTemplate,
    NodeView,
    PackageStep,
    ReasonRequest,
    RolloutResult,
    RolloutStatus,
    StageRecord,
)
from workflows.rollout.node_update import NodeUpdate
from workflows.rollout.spec.admission import MaintenanceWindow
from workflows.rollout.spec.spec import RolloutInput
from workflows.rollout.state import BatchState, CompartmentState, NodeStatus, RolloutCheckpoint

HISTORY_LIMIT = 8000  # continue as new past this, well under the server's 10,240 warning
BUDGET_POLL = timedelta(seconds=30)
RECENT_BATCHES = 20
PROBLEMS_SHOWN = 5  # erroring nodes named in `progress` (every one is in `status`)
SURVEY_PAGE = 1000
# workflow.patched() id of batch planning (docs/rollout-batch-planning.md): membership re-read before each batch,
# erroring nodes retried, the priority order, resetBatchStateOnCompletion. Runs from before keep their fixed members.
PLANNING_PATCH = "rollout-batch-planning"


# ---------------------------------------------------------------- RolloutBatch


@workflow.defn
class RolloutBatch:
    @workflow.init
    def __init__(self, inp: BatchInput) -> None:
        self._paused = False
        self._stopped = False
        self._running: dict[str, workflow.ChildWorkflowHandle] = {}
        self._waiting: dict[str, str] = {}  # node -> its place at the disruption budget

    @workflow.signal(description="Start no more nodes; running nodes hold after their current stage.")
    async def pause(self) -> None:
        self._paused = True
        await self._forward(NodeUpdate.pause)

    @workflow.signal(description="Carry on after a pause.")
    async def resume(self) -> None:
        self._paused = False
        await self._forward(NodeUpdate.resume)

    @workflow.signal(description="Start no more nodes; running nodes finish.")
    def stop(self) -> None:
        self._stopped = True

    @workflow.query
    def running(self) -> list[str]:
        return sorted(self._running)

    @workflow.query(description="Nodes waiting for the cluster's disruption budget, with their place.")
    def waiting_for_budget(self) -> dict[str, str]:
        return dict(sorted(self._waiting.items()))

    @workflow.run
    async def run(self, inp: BatchInput) -> BatchResult:
        results = dict(inp.results)
        todo = [n for n in inp.nodes if n.node not in results]
        slots = asyncio.Semaphore(inp.max_in_flight)
        not_started: list[str] = []
        # Runs from before SIGNAL_PATCH start their nodes without a lease: each NodeUpdate asks for its own.
        leased = inp.template.interrupt is not None and workflow.patched(SIGNAL_PATCH)

        async def one(n: BatchNode) -> None:
            async with slots:
                lease = None
                while True:
                    await self._admit(inp.windows)
                    if self._stopped:
                        not_started.append(n.node)
                        return
                    if not leased:
                        break
                    lease = await self._lease(inp, n.node)
                    if lease is not None:
                        break
                handle = await workflow.start_child_workflow(
                    NodeUpdate.run,
                    NodeUpdateInput(node=n.node, ordinal=n.ordinal, template=inp.template, lease=lease),
                    id=f"{inp.template.rollout}/{n.node}",
                    # The node's stages and drain inherit this (workflows/common/priorities.py).
                    priority=priorities.rollout(inp.template.cluster),
                    static_summary=f"{n.node} in batch {inp.number} of {inp.compartment}",
                )
                self._running[n.node] = handle
                self._details()
                if self._paused:
                    await handle.signal(NodeUpdate.pause)
                results[n.node] = await handle
                del self._running[n.node]
                self._details()

        # A sliding window over chunks of twice its size: between two chunks nothing runs,
        # and there the run may continue as new.
        chunk_size = 2 * inp.max_in_flight
        while todo:
            chunk, todo = todo[:chunk_size], todo[chunk_size:]
            await asyncio.gather(*(one(n) for n in chunk))
            if todo and not self._stopped and history_is_long(HISTORY_LIMIT):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={"nodes": todo, "results": results}))
        not_started += [n.node for n in todo]
        return BatchResult(results=results, not_started=not_started)

    async def _lease(self, inp: BatchInput, node: str) -> Lease | None:
        """The node's lease, held by its NodeUpdate-to-be; None when the batch is paused or stopped meanwhile (the
        request is withdrawn: a paused batch holds no place) or the grant comes outside the windows (returned)."""
        t, holder = inp.template, f"{inp.template.rollout}/{node}"

        def waiting(lease: Lease) -> None:
            self._waiting[node] = f"{lease.id}: queued #{lease.position}; {lease.note}"
            self._details()

        lease = await acquire_lease(t.cluster, node, holder=holder, reason=f"rollout {t.rollout}",
                                    budget=t.disruption_budget, cancelled=lambda: self._stopped or self._paused,
                                    waiting=waiting)  # fmt: skip
        self._waiting.pop(node, None)
        self._details()
        if lease is not None and inp.windows and not window_open(inp.windows, workflow.now()):
            await release_lease(t.cluster, node, holder, "granted outside the maintenance windows")
            return None
        return lease

    def _details(self) -> None:
        workflow.set_current_details(
            f"{len(self._running)} nodes running, {len(self._waiting)} waiting for the disruption budget"
        )

    async def _admit(self, windows: list[MaintenanceWindow]) -> None:
        """Wait while paused, and outside the maintenance windows: no node starts outside them."""
        while not self._stopped:
            if self._paused:
                await workflow.wait_condition(lambda: not self._paused or self._stopped)
                continue
            if windows and not window_open(windows, workflow.now()):
                await _sleep_until_window(windows, lambda: self._stopped or self._paused)
                continue
            return

    async def _forward(self, signal) -> None:
        for handle in list(self._running.values()):
            await handle.signal(signal)


async def _sleep_until_window(windows: list[MaintenanceWindow], wake: Callable[[], bool]) -> None:
    opens = next_window_open(windows, workflow.now())
    wait = (opens - workflow.now()) if opens else timedelta(hours=1)
    try:
        await workflow.wait_condition(
            wake, timeout=max(wait, timedelta(seconds=1)), timeout_summary="maintenance window closed"
        )
    except asyncio.TimeoutError:
        pass


# ---------------------------------------------------------------- Rollout


@workflow.defn
class Rollout:
    @workflow.init
    def __init__(self, inp: RolloutInput) -> None:
        self._inp = inp
        self._cp = inp.checkpoint or RolloutCheckpoint()
        self._paused_reason: str | None = self._cp.paused_reason
        self._aborted: str | None = None
        self._awaiting_approval: set[str] = set()
        self._approved: set[str] = set()
        self._batches: dict[str, workflow.ChildWorkflowHandle] = {}
        self._views: dict[str, CompartmentView] = {}
        self._recent: list[BatchView] = []
        self._stage_details: dict[str, list[StageRecord]] = {}
        self._continue = False
        self._gate_failing_since: dict[str, datetime] = {}
        self._phase = "planning" if inp.dry_run else "surveying"
        self._upserted: str | None = None
        self._planning = False  # PLANNING_PATCH, decided once per run
        self._live: dict[str, NodeSnapshot] = {}  # the last re-read, by name

    # ------------------------------------------------------------ queries

    @workflow.query(description="Rollout → compartment → batch → node → package/stage, with reasons.")
    def status(self) -> RolloutStatus:
        return RolloutStatus(
            phase=self._overall_phase(),
            paused_reason=self._paused_reason,
            aborted=self._aborted,
            counts=self._counts(),
            compartments=self._views,
            recent_batches=self._recent,
            problems={
                n: NodeView(
                    status=s,
                    reason=self._cp.reasons.get(n, ""),
                    stages=self._stage_details.get(n, []),
                    retries=self._cp.retries.get(n, 0),
                )
                for n, s in self._cp.nodes.items()
                if s in ("erroring", "blocked", "skipped")
            },
            joined=self._cp.joined,
            left=self._cp.left,
        )

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        counts = self._counts()
        done = sum(counts.get(s, 0) for s in ("complete", "erroring", "skipped"))
        return Progress(
            phase=self._overall_phase(),
            done=done,
            total=len(self._cp.nodes),
            details=self._summary(),
            finished=self._phase in ("completed", "aborted", "planned"),
        )

    # ------------------------------------------------------------ operator controls

    @workflow.update(
        description="Stop admitting nodes; running nodes hold after their current stage (never mid-interrupt)."
    )
    async def pause(self, req: ReasonRequest) -> RolloutStatus:
        self._paused_reason = req.reason
        await self._signal_batches(RolloutBatch.pause)
        self._refresh()
        return self.status()

    @pause.validator
    def _validate_pause(self, req: ReasonRequest) -> None:
        self._require_active()
        if self._paused_reason is not None:
            raise ValueError(f"already paused: {self._paused_reason}")

    @workflow.update(description="Resume after a pause (also after a failing gate paused the rollout).")
    async def resume(self, req: ReasonRequest) -> RolloutStatus:
        self._paused_reason = None
        await self._signal_batches(RolloutBatch.resume)
        self._refresh()
        return self.status()

    @resume.validator
    def _validate_resume(self, req: ReasonRequest) -> None:
        self._require_active()
        if self._paused_reason is None:
            raise ValueError("the rollout is not paused")

    @workflow.update(description="Finish the nodes in flight safely and leave every other node untouched.")
    async def abort(self, req: ReasonRequest) -> RolloutStatus:
        self._aborted = req.reason
        await self._signal_batches(RolloutBatch.stop)
        self._refresh()
        return self.status()

    @abort.validator
    def _validate_abort(self, req: ReasonRequest) -> None:
        self._require_active()

    @workflow.update(description="Approve the next batch of a compartment waiting for approval.")
    async def approve_batch(self, req: ApproveRequest) -> RolloutStatus:
        names = [req.compartment] if req.compartment else sorted(self._awaiting_approval)
        self._approved.update(names)
        self._refresh()
        return self.status()

    @approve_batch.validator
    def _validate_approve(self, req: ApproveRequest) -> None:
        self._require_active()
        if not self._awaiting_approval:
            raise ValueError("no batch is waiting for approval")
        if req.compartment and req.compartment not in self._awaiting_approval:
            raise ValueError(
                f"compartment {req.compartment!r} is not waiting for approval; waiting: {sorted(self._awaiting_approval)}"
            )

    @workflow.update(description="Put an erroring or blocked node back in line; it keeps its place in its compartment.")
    async def retry_node(self, req: NodeRequest) -> RolloutStatus:
        if self._cp.nodes[req.node] == "erroring":
            cs = self._compartment_of(req.node)
            cs.batch = cs.batch.model_copy(update={"failed_nodes": max(0, cs.batch.failed_nodes - 1)})
        self._set_node(req.node, "waiting", "")
        self._refresh()
        return self.status()

    @retry_node.validator
    def _validate_retry(self, req: NodeRequest) -> None:
        self._require_active()
        status = self._node_status(req.node)
        if status not in ("erroring", "blocked", "skipped"):
            raise ValueError(f"node {req.node} is {status}; only erroring, blocked or skipped nodes can be retried")

    @workflow.update(description="Never touch this node in this rollout (it keeps any cordon it has).")
    async def skip_node(self, req: NodeRequest) -> RolloutStatus:
        self._set_node(req.node, "skipped", f"skipped: {req.reason}")
        self._refresh()
        return self.status()

    @skip_node.validator
    def _validate_skip(self, req: NodeRequest) -> None:
        self._require_active()
        status = self._node_status(req.node)
        if status not in ("waiting", "blocked", "erroring"):
            raise ValueError(f"node {req.node} is {status}; only waiting, blocked or erroring nodes can be skipped")

    @workflow.update(description="Reset a compartment's batch state (NodeWright's `dp reset`): clears a stop.")
    async def reset_batch_state(self, req: CompartmentRequest) -> RolloutStatus:
        self._cp.compartments[req.compartment].batch = BatchState()
        self._refresh()
        return self.status()

    @reset_batch_state.validator
    def _validate_reset(self, req: CompartmentRequest) -> None:
        self._require_active()
        if req.compartment not in self._cp.compartments:
            raise ValueError(f"unknown compartment {req.compartment!r}; known: {sorted(self._cp.compartments)}")

    # ------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutResult:
        if inp.dry_run:
            nodes = await self._survey()
            self._phase = "planned"
            self._refresh()
            return RolloutResult(cluster=inp.cluster, name=inp.name, outcome="planned", plan=plan(nodes, inp))
        self._planning = workflow.patched(PLANNING_PATCH)
        if inp.checkpoint is None:
            await self._start(await self._survey())
        if self._planning:
            self._reset_on_version_change()
        self._phase = "running"
        self._refresh()
        if self._planning:
            await self._run_compartments()
        else:
            await asyncio.gather(*(self._run_compartment(name) for name in sorted(self._cp.compartments)))
        if self._continue and self._aborted is None:
            await workflow.wait_condition(workflow.all_handlers_finished)
            self._cp.paused_reason = self._paused_reason
            self._cp.runs += 1
            workflow.continue_as_new(inp.model_copy(update={"checkpoint": self._cp}))
        self._phase = "aborted" if self._aborted else "completed"
        self._refresh()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return RolloutResult(
            cluster=inp.cluster,
            name=inp.name,
            outcome="aborted" if self._aborted else "completed",
            counts=self._counts(),
            problems={
                n: self._cp.reasons.get(n, s)
                for n, s in self._cp.nodes.items()
                if s in ("erroring", "blocked", "skipped")
            },
            compartments={name: cs.batch for name, cs in self._cp.compartments.items()},
        )

    async def _survey(self) -> list[NodeSnapshot]:
        """The targeted nodes, page by page, keeping only the labels compartments look at."""
        inp = self._inp
        keys = {r.key for r in inp.node_selectors.requirements()} | {NODE_PRIORITY_LABEL}
        for compartment in inp.deployment_policy.compartments:
            keys |= {r.key for r in compartment.selector.requirements()}
        nodes, token = [], None
        while True:
            page = await workflow.execute_activity_method(
                KubeActivities.list_nodes_page,
                NodePageRequest(
                    cluster=inp.cluster,
                    label_selector=inp.node_selectors.to_selector_string(),
                    label_keys=sorted(keys),
                    limit=SURVEY_PAGE,
                    continue_token=token,
                ),
                **API_CALL,
                priority=priorities.rollout(inp.cluster),
                summary="list targeted nodes",
            )
            nodes += [
                NodeSnapshot(
                    name=n.name, labels=n.labels, unschedulable=n.unschedulable, ready=n.ready, created=n.created
                )
                for n in page.nodes
            ]
            token = page.continue_token
            if not token:
                return nodes

    async def _start(self, nodes: list[NodeSnapshot]) -> None:
        assignment = assign_compartments(nodes, self._inp.deployment_policy)
        self._cp.compartments = {
            name: CompartmentState(members=members) for name, members in assignment.items() if members
        }
        self._cp.nodes = {n.name: "waiting" for n in sorted(nodes, key=lambda n: n.name)}
        self._live = {n.name: n for n in nodes}

    def _reset_on_version_change(self) -> None:
        """resetBatchStateOnCompletion also resets on a version change: batch states carried from other versions."""
        versions = self._inp.package_versions()
        if self._cp.package_versions and self._cp.package_versions != versions and self._inp.resets_batch_state():
            for cs in self._cp.compartments.values():
                cs.batch, cs.completed = BatchState(), False
        self._cp.package_versions = versions

    async def _run_compartments(self) -> None:
        """Every compartment with work, concurrently; one that gains nodes mid-rollout starts when it does, and
        before finishing the rollout takes a last look for nodes that started matching meanwhile."""
        running: dict[str, asyncio.Task[None]] = {}

        def idle_with_work() -> bool:
            return not self._woken() and any(
                name not in running and self._pending(cs) for name, cs in self._cp.compartments.items()
            )

        while True:
            if not self._woken():
                for name, cs in sorted(self._cp.compartments.items()):
                    if name not in running and self._pending(cs):
                        running[name] = asyncio.create_task(self._run_compartment(name))
            if not running:
                if self._woken():
                    return
                self._membership(await self._survey())
                if not idle_with_work():
                    return
                continue
            await workflow.wait_condition(lambda: any(t.done() for t in running.values()) or idle_with_work())
            for name in [n for n, t in running.items() if t.done()]:
                running.pop(name).result()

    def _membership(self, nodes: list[NodeSnapshot]) -> MembershipChange:
        """Apply a re-read: joined and left nodes (workflows/rollout/membership.py), the views' sizes."""
        self._live = {n.name: n for n in nodes}
        change = reconcile(self._cp, nodes, self._inp.deployment_policy)
        for name, view in self._views.items():
            cs = self._cp.compartments[name]
            view.members = len(cs.members)
            view.ceiling = ceiling(compartment_budget(self._inp.deployment_policy, name), len(cs.members))
        if change:
            self._refresh()
        return change

    async def _run_compartment(self, name: str) -> None:
        inp, cs = self._inp, self._cp.compartments[name]
        strategy = compartment_strategy(inp.deployment_policy, name)
        cap = ceiling(compartment_budget(inp.deployment_policy, name), len(cs.members))
        view = self._views.get(name) if self._planning else None
        if view is None:
            view = self._views[name] = CompartmentView(
                name=name, strategy=strategy_name(strategy), members=len(cs.members), ceiling=cap, batch_state=cs.batch
            )
        members = set(cs.members)
        while self._aborted is None:
            pending = self._pending(cs)
            if not pending:
                if self._planning and all(self._cp.nodes[n] in ("complete", "skipped") for n in cs.members):
                    cs.completed = True
                view.phase = "done"
                break
            # Between batches, every compartment parks when one asks to continue as new.
            if self._continue or history_is_long(HISTORY_LIMIT):
                self._continue = True
                break
            if cs.batch.should_stop:
                self._enter(
                    view,
                    "stopped",
                    f"stopped after {cs.batch.consecutive_failures} failed batches; reset_batch_state to go on",
                )
                await workflow.wait_condition(lambda: self._woken() or not cs.batch.should_stop)
                continue
            if not await self._gates(name, view):
                continue
            if all(self._cp.nodes[n] == "blocked" for n in pending):
                self._enter(view, "waiting-for-blocked-nodes", f"{len(pending)} nodes wait for non-interruptible pods")
                await self._sleep(inp.non_interrupt_retry_interval, "nodes blocked by non-interruptible pods")
            change = MembershipChange()
            if self._planning:
                # One paged re-read per batch: who is in the rollout now, and who is out of service.
                change = self._membership(await self._survey())
                pending = self._pending(cs)
                if not pending:
                    continue
                cap = view.ceiling
                unavailable = {n for n in cs.members if n in self._live and self._live[n].unavailable}
                if cs.completed:  # nodes joined a compartment that had finished
                    if inp.resets_batch_state():
                        cs.batch = BatchState()
                    cs.completed = False
            else:
                unavailable = (
                    set(
                        await workflow.execute_activity_method(
                            KubeActivities.list_unavailable_nodes,
                            UnavailableRequest(
                                cluster=inp.cluster, label_selector=inp.node_selectors.to_selector_string()
                            ),
                            **API_CALL,
                            priority=priorities.rollout(inp.cluster),
                            summary=f"count unavailable nodes for {name}",
                        )
                    )
                    & members
                )
            active = len(cs.members) - sum(1 for n in cs.members if self._cp.nodes[n] == "skipped")
            # A node due for a retry is not done yet: the strategy counts it among the nodes remaining.
            retries_due = sum(1 for n in pending if self._cp.nodes[n] == "erroring")
            state = cs.batch.model_copy(update={"failed_nodes": max(0, cs.batch.failed_nodes - retries_due)})
            size = next_batch_size(strategy, state, active, cap)
            admit = admissible(size, cap, len(unavailable))
            if admit == 0:
                self._enter(
                    view, "waiting-for-budget", f"{len(unavailable)} of {cap} allowed nodes already out of service"
                )
                await self._sleep(BUDGET_POLL, "budget exhausted by unavailable nodes")
                continue
            if self._planning:
                chosen = batch_order(pending, self._live, self._cp.nodes, unavailable)[:admit]
            else:
                # Nodes already out of service cost nothing more to take: they go first, then
                # waiting nodes before blocked ones, each in name order.
                ordered = sorted(pending, key=lambda n: (n not in unavailable, self._cp.nodes[n] == "blocked", n))
                chosen = sorted(ordered[:admit])
            retried = [n for n in chosen if self._cp.nodes[n] == "erroring"]
            for node in retried:
                self._cp.retries[node] = self._cp.retries.get(node, 0) + 1
            if retried:  # back in play: its next outcome is counted like any node's
                cs.batch = cs.batch.model_copy(update={"failed_nodes": max(0, cs.batch.failed_nodes - len(retried))})
            await self._run_batch(name, view, cs, chosen, cap, len(unavailable), size, change, retried)
            if inp.soak_time and self._aborted is None:
                self._enter(view, "running", f"soaking for {inp.soak_time}")
                await self._sleep(inp.soak_time, "soak after batch")
        self._refresh()

    async def _gates(self, name: str, view: CompartmentView) -> bool:
        """Pause, maintenance window, approval, batch gate; True when all pass now."""
        inp = self._inp
        if self._paused_reason is not None:
            self._enter(view, "paused", self._paused_reason)
            await workflow.wait_condition(lambda: self._paused_reason is None or self._woken())
            return False
        if inp.maintenance_windows and not window_open(inp.maintenance_windows, workflow.now()):
            opens = next_window_open(inp.maintenance_windows, workflow.now())
            self._enter(view, "waiting-for-window", f"next window opens {opens.isoformat() if opens else 'never'}")
            await _sleep_until_window(inp.maintenance_windows, lambda: self._woken() or self._paused_reason is not None)
            return False
        needs_approval = inp.approval == "batch" or (
            inp.approval == "compartment" and name not in self._cp.approved_compartments
        )
        if needs_approval and name not in self._approved:
            self._awaiting_approval.add(name)
            self._enter(view, "waiting-for-approval", f"batch {view.batch_state.current_batch} awaits approve_batch")
            await workflow.wait_condition(
                lambda: name in self._approved or self._woken() or self._paused_reason is not None
            )
            self._awaiting_approval.discard(name)
            return False
        if inp.gate is not None:
            problems = await self._check_gate()
            if problems:
                since = self._gate_failing_since.setdefault(name, workflow.now())
                if workflow.now() - since >= inp.gate.timeout:
                    # An operator decides: the gate has failed for as long as the spec tolerates.
                    del self._gate_failing_since[name]
                    self._paused_reason = f"gate failing for {inp.gate.timeout}: {'; '.join(problems)[:500]}"
                    return False
                self._enter(view, "gate-failing", "; ".join(problems)[:500])
                await self._sleep(inp.gate.interval, "batch gate failing")
                return False
            self._gate_failing_since.pop(name, None)
        return True

    async def _check_gate(self) -> list[str]:
        gate, inp = self._inp.gate, self._inp
        assert gate is not None
        problems: list[str] = []
        if gate.node_conditions:
            problems += await workflow.execute_activity_method(
                KubeActivities.check_node_conditions,
                ConditionGate(
                    cluster=inp.cluster,
                    label_selector=inp.node_selectors.to_selector_string(),
                    conditions=gate.node_conditions,
                ),
                **API_CALL,
                priority=priorities.rollout(inp.cluster),
                summary="gate: node conditions",
            )
        if gate.prometheus is not None:
            q = gate.prometheus
            values = await workflow.execute_activity_method(
                PrometheusActivities.query_prometheus,
                PrometheusQuery(url=q.url, query=q.query),
                **API_CALL,
                priority=priorities.rollout(inp.cluster),
                summary="gate: prometheus query",
            )
            if q.min_value is None and q.max_value is None:
                if values:
                    problems.append(f"{q.query} returned {len(values)} series")
            else:
                bad = [
                    v
                    for v in values
                    if (q.min_value is not None and v < q.min_value) or (q.max_value is not None and v > q.max_value)
                ]
                if bad or not values:
                    problems.append(f"{q.query} = {values or 'no data'} outside [{q.min_value}, {q.max_value}]")
        return problems

    async def _run_batch(
        self,
        name: str,
        view: CompartmentView,
        cs: CompartmentState,
        chosen: list[str],
        cap: int,
        unavailable: int,
        size: int,
        change: MembershipChange,
        retried: list[str],
    ) -> None:
        inp, number = self._inp, cs.batch.current_batch
        nodes = []
        for node in chosen:
            nodes.append(BatchNode(node=node, ordinal=self._cp.next_ordinal))
            self._cp.next_ordinal += 1
            self._set_node(node, "in_progress", "")
        batch_view = BatchView(
            compartment=name,
            number=number,
            ceiling=cap,
            unavailable_before=unavailable,
            strategy_size=size,
            started=workflow.now(),
            order=chosen,
            retried=retried,
            joined=sorted(change.joined),
            left=sorted(change.left),
        )
        view.current_batch = batch_view
        self._enter(view, "running", f"batch {number}: {len(chosen)} nodes")
        self._approved.discard(name)
        if inp.approval == "compartment" and name not in self._cp.approved_compartments:
            self._cp.approved_compartments.append(name)
        handle = await workflow.start_child_workflow(
            RolloutBatch.run,
            BatchInput(
                compartment=name,
                number=number,
                nodes=nodes,
                template=self._template(),
                windows=inp.maintenance_windows,
                max_in_flight=inp.max_in_flight,
            ),
            id=f"{workflow.info().workflow_id}/{name}/batch-{self._cp.runs}-{number}-{nodes[0].ordinal}",
            priority=priorities.rollout(inp.cluster),
            static_summary=f"{name} batch {number}: {len(nodes)} nodes",
        )
        self._batches[name] = handle
        if self._paused_reason is not None:
            await handle.signal(RolloutBatch.pause)
        if self._aborted is not None:
            await handle.signal(RolloutBatch.stop)
        result: BatchResult = await handle
        del self._batches[name]
        succeeded = failed = 0
        for node, res in result.results.items():
            self._set_node(node, res.outcome, res.reason)
            self._stage_details[node] = res.stages
            if res.outcome == "complete":
                batch_view.completed += 1
            else:
                batch_view.nodes[node] = NodeView(status=res.outcome, reason=res.reason, stages=res.stages)
            succeeded += res.outcome == "complete"
            failed += res.outcome == "erroring"
        for node in result.not_started:
            self._set_node(node, "waiting", "")
        active = len(cs.members) - sum(1 for n in cs.members if self._cp.nodes[n] == "skipped")
        cs.batch = evaluate_batch(
            compartment_strategy(inp.deployment_policy, name), cs.batch, succeeded, failed, active
        )
        view.batch_state = cs.batch
        batch_view.finished = workflow.now()
        if succeeded + failed:
            batch_view.success_percent = succeeded * 100 // (succeeded + failed)
        view.current_batch = None
        self._recent = (self._recent + [batch_view])[-RECENT_BATCHES:]
        self._refresh()

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
            # The cluster's disruption budget, if it has none yet: what this rollout alone may take out at once.
            disruption_budget=Budget(
                count=max(
                    1,
                    sum(
                        ceiling(compartment_budget(inp.deployment_policy, name), len(cs.members))
                        for name, cs in self._cp.compartments.items()
                    ),
                )
            ),
        )

    # ------------------------------------------------------------ state and visibility

    def _pending(self, cs: CompartmentState) -> list[str]:
        """Nodes a next batch may take: waiting and blocked ones, and erroring ones with retries left."""
        limit = self._inp.deployment_policy.retry_erroring_nodes if self._planning else 0
        return [
            n
            for n in cs.members
            if self._cp.nodes[n] in ("waiting", "blocked") or (limit and retryable(self._cp, n, limit))
        ]

    def _set_node(self, node: str, status: NodeStatus, reason: str) -> None:
        self._cp.nodes[node] = status
        if reason:
            self._cp.reasons[node] = reason
        else:
            self._cp.reasons.pop(node, None)

    def _node_status(self, node: str) -> str:
        if node not in self._cp.nodes:
            raise ValueError(f"node {node!r} is not part of this rollout")
        return self._cp.nodes[node]

    def _compartment_of(self, node: str) -> CompartmentState:
        return next(cs for cs in self._cp.compartments.values() if node in cs.members)

    def _require_active(self) -> None:
        if self._aborted is not None:
            raise ValueError(f"the rollout is aborting: {self._aborted}")
        if self._phase in ("completed", "aborted", "planned", "planning", "surveying"):
            raise ValueError(f"the rollout is {self._phase}")

    async def _signal_batches(self, signal) -> None:
        for handle in list(self._batches.values()):
            await handle.signal(signal)

    def _woken(self) -> bool:
        """A waiting compartment must look up: the rollout aborts or continues as new."""
        return self._aborted is not None or self._continue

    async def _sleep(self, duration: timedelta, summary: str) -> None:
        try:
            await workflow.wait_condition(
                lambda: self._woken() or self._paused_reason is not None,
                timeout=duration,
                timeout_summary=summary,
            )
        except asyncio.TimeoutError:
            pass

    def _counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for status in self._cp.nodes.values():
            counts[status] = counts.get(status, 0) + 1
        return counts

    def _enter(self, view: CompartmentView, phase: CompartmentPhase, note: str) -> None:
        view.phase, view.note = phase, note
        self._refresh()

    def _overall_phase(self) -> str:
        if self._phase != "running":
            return self._phase
        if self._aborted is not None:
            return "aborting"
        if self._paused_reason is not None:
            return "paused"
        if self._views and all(v.phase == "stopped" for v in self._views.values() if v.phase != "done"):
            return "stopped"
        return "running"

    def _refresh(self) -> None:
        """Current details, phase search attribute and metrics, from the state."""
        phase = self._overall_phase()
        if phase != self._upserted:  # each upsert is a history event
            publish_phase(phase, sa.CLUSTER.value_set(self._inp.cluster))
            self._upserted = phase
        workflow.set_current_details(self._summary())
        meter = workflow.metric_meter().with_additional_attributes({"rollout": workflow.info().workflow_id})
        nodes = meter.create_gauge("millwright_rollout_nodes", "Nodes of a rollout by state")
        for status in ("waiting", "in_progress", "complete", "erroring", "blocked", "skipped"):
            nodes.set(self._counts().get(status, 0), {"state": status})
        batch = meter.create_gauge("millwright_rollout_batch", "Current batch number per compartment")
        failures = meter.create_gauge("millwright_rollout_consecutive_failures", "Consecutive failed batches")
        for name, cs in self._cp.compartments.items():
            batch.set(cs.batch.current_batch, {"compartment": name})
            failures.set(cs.batch.consecutive_failures, {"compartment": name})

    def _summary(self) -> str:
        counts = self._counts()
        total = len(self._cp.nodes)
        lines = [
            f"**{self._overall_phase()}** rollout `{self._inp.name}` on `{self._inp.cluster}`: "
            f"{counts.get('complete', 0)}/{total} complete, {counts.get('in_progress', 0)} in progress, "
            f"{counts.get('erroring', 0)} erroring, {counts.get('blocked', 0)} blocked"
        ]
        if self._paused_reason:
            lines.append(f"paused: {self._paused_reason}")
        if self._aborted:
            lines.append(f"aborting: {self._aborted}")
        if self._cp.joined or self._cp.left:
            lines.append(f"membership: {len(self._cp.joined)} nodes joined, {len(self._cp.left)} left mid-rollout")
        for view in self._views.values():
            lines.append(
                f"- `{view.name}` {view.phase} (batch {view.batch_state.current_batch}, ceiling {view.ceiling}): {view.note}"
            )
        # Why nodes failed (a stage, the validation gate), so a watcher sees it without the status query.
        erroring = [n for n, s in self._cp.nodes.items() if s == "erroring"]
        lines += [f"- node `{n}` erroring: {self._cp.reasons.get(n, '')[:300]}" for n in erroring[:PROBLEMS_SHOWN]]
        return "\n".join(lines)
