"""The engine of a fleet run: nodes split into compartments, each taken batch by batch under its DeploymentPolicy.

`Compartments` is workflow code without a workflow (as workflows/maintenance/drain.py's `Drain`): a fleet workflow
(`Rollout`; a firmware or GPU-partitioning run over many nodes) holds one and names the per-node work; the engine
knows nothing of packages. `FleetControls` gives such a workflow the operator's controls and queries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from activities.kube.models import StageRecord
from activities.kube.topology import GangMap
from workflows.budget.budget import ceiling
from workflows.common import priorities
from workflows.common import search_attributes as sa
from workflows.common.base import Progress, history_is_long, publish_phase
from workflows.rollout.batching import (
    NodeSnapshot,
    admissible,
    admit,
    assign_compartments,
    batch_order,
    compartment_budget,
    compartment_strategy,
    evaluate_batch,
    next_batch_size,
    next_window_open,
    places_of,
    strategy_name,
    unit_over_ceiling,
    window_open,
)
from workflows.rollout.cluster_reads import check_gate, read_gangs, survey, unavailable_nodes
from workflows.rollout.gate_clock import GateClock
from workflows.rollout.membership import MembershipChange, reconcile, retryable
from workflows.rollout.models import (
    BatchInput,
    BatchNode,
    BatchResult,
    BatchView,
    CompartmentPhase,
    CompartmentView,
    NodeOutcome,
    NodeView,
    NodeWork,
    RolloutStatus,
)
from workflows.rollout.spec.fleet import FleetSpec
from workflows.rollout.state import BatchState, CompartmentState, NodeStatus, RolloutCheckpoint
from workflows.rollout.unit_batching import UnitBatch, topology_note, unit_batch
from workflows.rollout.windows import WINDOW_BY_TIMER, sleep_until_window

HISTORY_LIMIT = 8000  # continue as new past this, well under the server's 10,240 warning
BUDGET_POLL = timedelta(seconds=30)
RECENT_BATCHES = 20
PROBLEMS_SHOWN = 5  # erroring nodes named in `progress` (every one is in `status`)
BATCH_WORKFLOW = "RolloutBatch"  # workflows/rollout/rollout.py: leases and starts one batch's per-node children
PROBLEM_STATES = ("erroring", "blocked", "skipped")
MATCHED_NO_NODE = "the node selectors matched no node"  # a finished run's, as a plan's "match no node"
# workflow.patched() id: a batch takes a node already out of service (an erroring node due for its retry) whatever
# the ceiling's room, as it costs nothing more (batching.admit).
OUT_OF_SERVICE_PATCH = "fleet-out-of-service-costs-nothing"


class Compartments:
    """A fleet run's nodes, compartment by compartment, batch by batch (NodeWright's DeploymentPolicy).

    A fleet workflow builds one in its `@workflow.init`:
    `Compartments(inp, work=..., read=..., noun="firmware update")`, where `inp` has the FleetSpec fields,
    `work()` returns the `NodeWork` of the next batch (the per-node child workflow's type and its input, which field
    gets the node, and whether each node is leased from the cluster's disruption budget first) and `read(result)`
    turns a child's result (JSON) into a `NodeOutcome` (complete, erroring or blocked, why, its stages).
    Its `run` method then calls `await start()` on a first run (survey, compartments), `await run()`, and
    continues as new with `carry()` as the input's checkpoint while `continuing`; else `finish()`. The workflow
    class inherits `FleetControls` for pause, resume, abort, approvals, retry or skip a node, reset and the
    `status` and `progress` queries. Each batch is a `RolloutBatch` child; every node a child of it.
    """

    def __init__(
        self,
        spec: FleetSpec,
        work: Callable[[], NodeWork],
        read: Callable[[Any], NodeOutcome],
        *,
        noun: str = "rollout",
        phase: str = "surveying",
    ) -> None:
        self.spec, self._work, self._read, self.noun = spec, work, read, noun
        self.cp = spec.checkpoint or RolloutCheckpoint()
        self.phase = phase
        self.paused_reason: str | None = self.cp.paused_reason
        self.aborted: str | None = None
        self.continuing = False  # between batches every compartment parks; the workflow continues as new
        self.planning = True  # runs of a Rollout from before PLANNING_PATCH (rollout.py) keep their fixed members
        self._awaiting_approval: set[str] = set()
        self._approved: set[str] = set()
        self._batches: dict[str, workflow.ChildWorkflowHandle] = {}
        self._views: dict[str, CompartmentView] = {}
        self._recent: list[BatchView] = []
        self._stage_details: dict[str, list[StageRecord]] = {}
        self._gate_clock = GateClock()
        self._window_opened: set[str] = set()  # compartments whose window wait's timer just fired (WINDOW_BY_TIMER)
        self._upserted: str | None = None
        self._live: dict[str, NodeSnapshot] = {}  # the last re-read, by name
        self._gangs = GangMap()  # with batchBy: the last read, before the last batch decision

    # ------------------------------------------------------------ the run

    async def start(self) -> None:
        """A first run: the targeted nodes, assigned to compartments, every one waiting."""
        nodes = await self.survey()
        assignment = assign_compartments(nodes, self.spec.deployment_policy)
        if refusal := unit_over_ceiling(nodes, assignment, self.spec):  # batchBy: it could only be taken in part
            raise ApplicationError(refusal, type="UnitOverCeiling", non_retryable=True)
        self.cp.compartments = {name: CompartmentState(members=m) for name, m in assignment.items() if m}
        self.cp.nodes = {n.name: "waiting" for n in sorted(nodes, key=lambda n: n.name)}
        self._live = {n.name: n for n in nodes}

    async def run(self) -> None:
        """Every compartment until done, aborted, or `continuing`."""
        self.phase = "running"
        self.refresh()
        if self.planning:
            await self._run_compartments()
        else:
            await asyncio.gather(*(self._run_compartment(name) for name in sorted(self.cp.compartments)))

    def continues(self) -> bool:
        """The run stopped between batches to continue as new (not aborting)."""
        return self.continuing and self.aborted is None

    def carry(self) -> RolloutCheckpoint:
        """The checkpoint the next run continues from."""
        self.cp.paused_reason = self.paused_reason
        self.cp.runs += 1
        return self.cp

    def finish(self) -> dict[str, str]:
        """The final phase; the nodes that did not complete, with why."""
        self.phase = "aborted" if self.aborted else "completed"
        self.refresh()
        return {n: self.cp.reasons.get(n, s) for n, s in self.cp.nodes.items() if s in PROBLEM_STATES}

    async def survey(self) -> list[NodeSnapshot]:
        return await survey(self.spec)

    def matched_no_node(self) -> bool:
        """The run completed without any node ever in it (one that left is in `cp.left`)."""
        return self.phase == "completed" and not self.cp.nodes and not self.cp.left

    async def _run_compartments(self) -> None:
        """Every compartment with work, concurrently; one that gains nodes mid-run starts when it does, and
        before finishing the run takes a last look for nodes that started matching meanwhile."""
        running: dict[str, asyncio.Task[None]] = {}

        def idle_with_work() -> bool:
            return not self._woken() and any(
                name not in running and self._pending(cs) for name, cs in self.cp.compartments.items()
            )

        while True:
            if not self._woken():
                for name, cs in sorted(self.cp.compartments.items()):
                    if name not in running and self._pending(cs):
                        running[name] = asyncio.create_task(self._run_compartment(name))
            if not running:
                if self._woken():
                    return
                self._membership(await self.survey())
                if not idle_with_work():
                    return
                continue
            await workflow.wait_condition(lambda: any(t.done() for t in running.values()) or idle_with_work())
            for name in [n for n, t in running.items() if t.done()]:
                running.pop(name).result()

    def _membership(self, nodes: list[NodeSnapshot]) -> MembershipChange:
        """Apply a re-read: joined and left nodes (workflows/rollout/membership.py), the views' sizes."""
        self._live = {n.name: n for n in nodes}
        change = reconcile(self.cp, nodes, self.spec.deployment_policy)
        for name, view in self._views.items():
            cs = self.cp.compartments[name]
            view.members = len(cs.members)
            view.ceiling = ceiling(compartment_budget(self.spec.deployment_policy, name), len(cs.members))
        if change:
            self.refresh()
        return change

    def _view(self, name: str) -> CompartmentView:
        cs, policy = self.cp.compartments[name], self.spec.deployment_policy
        view = self._views.get(name) if self.planning else None
        if view is None:
            view = self._views[name] = CompartmentView(
                name=name,
                strategy=strategy_name(compartment_strategy(policy, name)),
                members=len(cs.members),
                ceiling=ceiling(compartment_budget(policy, name), len(cs.members)),
                batch_state=cs.batch,
            )
        return view

    async def _run_compartment(self, name: str) -> None:
        spec, cs, view = self.spec, self.cp.compartments[name], self._view(name)
        while self.aborted is None:
            pending = self._pending(cs)
            if not pending:
                if self.planning and all(self.cp.nodes[n] in ("complete", "skipped") for n in cs.members):
                    cs.completed = True
                view.phase = "done"
                break
            # Between batches, every compartment parks when one asks to continue as new.
            if self.continuing or history_is_long(HISTORY_LIMIT):
                self.continuing = True
                break
            if cs.batch.should_stop:
                note = f"stopped after {cs.batch.consecutive_failures} failed batches; reset_batch_state to go on"
                self._enter(view, "stopped", note)
                await workflow.wait_condition(lambda: self._woken() or not cs.batch.should_stop)
                continue
            if not await self._gates(name, view):
                continue
            if all(self.cp.nodes[n] == "blocked" for n in pending):
                self._enter(view, "waiting-for-blocked-nodes", f"{len(pending)} nodes wait for non-interruptible pods")
                await self._sleep(spec.non_interrupt_retry_interval, "nodes blocked by non-interruptible pods")
            looked = await (self._look(cs) if self.planning else self._look_before_planning(name, cs, pending))
            if looked is None:
                continue
            pending, unavailable, change = looked
            cap = view.ceiling
            active = len(cs.members) - sum(1 for n in cs.members if self.cp.nodes[n] == "skipped")
            # A node due for a retry is not done yet: the strategy counts it among the nodes remaining.
            retries_due = sum(1 for n in pending if self.cp.nodes[n] == "erroring")
            state = cs.batch.model_copy(update={"failed_nodes": max(0, cs.batch.failed_nodes - retries_due)})
            size = next_batch_size(compartment_strategy(spec.deployment_policy, name), state, active, cap)
            taken = self._choose_units(name, view, pending, unavailable, size, cap) if spec.batch_by != "none" else None
            chosen = taken.nodes if taken is not None else self._choose(pending, unavailable, size, cap)
            if not chosen:
                note = f"{len(unavailable)} of {cap} allowed nodes already out of service"
                self._enter(view, "waiting-for-budget", note)
                await self._sleep(BUDGET_POLL, "budget exhausted by unavailable nodes")
                continue
            retried = [n for n in chosen if self.cp.nodes[n] == "erroring"]
            for node in retried:
                self.cp.retries[node] = self.cp.retries.get(node, 0) + 1
            if retried:  # back in play: its next outcome is counted like any node's
                cs.batch = cs.batch.model_copy(update={"failed_nodes": max(0, cs.batch.failed_nodes - len(retried))})
            batch_view = BatchView(
                compartment=name,
                number=cs.batch.current_batch,
                ceiling=cap,
                unavailable_before=len(unavailable),
                strategy_size=size,
                started=workflow.now(),
                order=chosen,
                retried=retried,
                joined=sorted(change.joined),
                left=sorted(change.left),
                units=taken.units if taken is not None else {},
                gangs=taken.gangs if taken is not None else [],
            )
            await self._run_batch(name, view, cs, batch_view)
            if spec.soak_time and self.aborted is None:
                self._enter(view, "running", f"soaking for {spec.soak_time}")
                await self._sleep(spec.soak_time, "soak after batch")
        self.refresh()

    async def _look(self, cs: CompartmentState) -> tuple[list[str], set[str], MembershipChange] | None:
        """One paged re-read per batch: who is in the run now, and who is out of service; None: nothing pending."""
        change = self._membership(await self.survey())
        pending = self._pending(cs)
        if not pending:
            return None
        unavailable = {n for n in cs.members if n in self._live and self._live[n].unavailable}
        if cs.completed:  # nodes joined a compartment that had finished
            if self.spec.resets_batch_state():
                cs.batch = BatchState()
            cs.completed = False
        self._gangs = await read_gangs(self.spec)
        return pending, unavailable, change

    async def _look_before_planning(
        self, name: str, cs: CompartmentState, pending: list[str]
    ) -> tuple[list[str], set[str], MembershipChange]:
        """Runs from before batch planning: fixed members, the compartment's unavailable nodes asked of the cluster."""
        unavailable = await unavailable_nodes(self.spec, name)
        return pending, set(unavailable) & set(cs.members), MembershipChange()

    def _choose(self, pending: list[str], unavailable: set[str], size: int, cap: int) -> list[str]:
        """The next batch's nodes, at most `size`, under the ceiling `cap`; empty: wait for the budget."""
        if self.planning:
            order = batch_order(pending, self._live, self.cp.nodes, unavailable)
        else:
            # Before batch planning: nodes already out of service cost nothing more to take: they go first, then
            # waiting nodes before blocked ones, each in name order.
            order = sorted(pending, key=lambda n: (n not in unavailable, self.cp.nodes[n] == "blocked", n))
        # Decided only where the rules differ (a node due is out of service), after the survey's activity.
        if unavailable.intersection(pending) and workflow.patched(OUT_OF_SERVICE_PATCH):
            chosen = admit(order, unavailable, size, cap)
        else:  # runs from before: such a node filled the ceiling as a new one would, so one could stall the run
            chosen = order[: admissible(size, cap, len(unavailable))]
        return chosen if self.planning else sorted(chosen)

    def _choose_units(
        self, name: str, view: CompartmentView, pending: list[str], unavailable: set[str], size: int, cap: int
    ) -> UnitBatch:
        """With batchBy: the next batch of whole units (workflows/rollout/unit_batching.py), by the last gangs read."""
        members = [self._live.get(n) or NodeSnapshot(name=n) for n in self.cp.compartments[name].members]
        places = places_of(members, self.spec.topology)
        view.topology = topology_note(list(places.values()), self.spec.batch_by, self.spec.topology.clique)
        order = batch_order(pending, self._live, self.cp.nodes, unavailable)
        return unit_batch(order, places, self.spec.batch_by, self._gangs.gangs, unavailable, size, cap)

    async def _gates(self, name: str, view: CompartmentView) -> bool:
        """Pause, maintenance window, approval, batch gate; True when all pass now."""
        spec = self.spec
        opened = name in self._window_opened  # only the look right after the window's timer fired
        self._window_opened.discard(name)
        if self.paused_reason is not None:
            self._enter(view, "paused", self.paused_reason)
            await workflow.wait_condition(lambda: self.paused_reason is None or self._woken())
            return False
        if spec.maintenance_windows and not opened and not window_open(spec.maintenance_windows, workflow.now()):
            opens = next_window_open(spec.maintenance_windows, workflow.now())
            self._enter(view, "waiting-for-window", f"next window opens {opens.isoformat() if opens else 'never'}")
            fired = await sleep_until_window(spec.maintenance_windows, self._interrupted)
            if fired and workflow.patched(WINDOW_BY_TIMER):
                self._window_opened.add(name)
            return False
        needs_approval = spec.approval == "batch" or (
            spec.approval == "compartment" and name not in self.cp.approved_compartments
        )
        if needs_approval and name not in self._approved:
            self._awaiting_approval.add(name)
            self._enter(view, "waiting-for-approval", f"batch {view.batch_state.current_batch} awaits approve_batch")
            await workflow.wait_condition(
                lambda: name in self._approved or self._woken() or self.paused_reason is not None
            )
            self._awaiting_approval.discard(name)
            return False
        if spec.gate is not None:
            problems = await check_gate(spec, spec.gate)
            if problems:
                if self._gate_clock.timed_out(name, spec.gate.timeout):
                    # An operator decides: the gate has failed for as long as the spec tolerates.
                    self._gate_clock.passed(name)
                    self.paused_reason = f"gate failing for {spec.gate.timeout}: {'; '.join(problems)[:500]}"
                    return False
                self._enter(view, "gate-failing", "; ".join(problems)[:500])
                if (deadline := self._gate_clock.deadline(name)) is not None:  # the timeout ends the wait too
                    await deadline.wait(self._interrupted, at_most=spec.gate.interval, summary="batch gate failing")
                else:
                    await self._sleep(spec.gate.interval, "batch gate failing")
                return False
            self._gate_clock.passed(name)
        return True

    async def _run_batch(self, name: str, view: CompartmentView, cs: CompartmentState, batch_view: BatchView) -> None:
        spec, number, chosen = self.spec, cs.batch.current_batch, batch_view.order
        nodes = []
        for node in chosen:
            nodes.append(BatchNode(node=node, ordinal=self.cp.next_ordinal))
            self.cp.next_ordinal += 1
            self._set_node(node, "in_progress", "")
        view.current_batch = batch_view
        self._enter(view, "running", f"batch {number}: {len(chosen)} nodes")
        self._approved.discard(name)
        if spec.approval == "compartment" and name not in self.cp.approved_compartments:
            self.cp.approved_compartments.append(name)
        handle = await workflow.start_child_workflow(
            BATCH_WORKFLOW,
            BatchInput(
                compartment=name,
                number=number,
                nodes=nodes,
                work=self._work(),
                windows=spec.maintenance_windows,
                max_in_flight=spec.max_in_flight,
            ),
            id=f"{workflow.info().workflow_id}/{name}/batch-{self.cp.runs}-{number}-{nodes[0].ordinal}",
            result_type=BatchResult,
            priority=priorities.rollout(spec.cluster),
            static_summary=f"{name} batch {number}: {len(nodes)} nodes",
        )
        self._batches[name] = handle
        if self.paused_reason is not None:
            await handle.signal("pause")
        if self.aborted is not None:
            await handle.signal("stop")
        result: BatchResult = await handle
        del self._batches[name]
        succeeded = failed = 0
        for node, raw in result.raw().items():
            self.cp.cost.add((res := self._read(raw)).cost)  # the run's cost: its nodes', a gang counted once
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
        active = len(cs.members) - sum(1 for n in cs.members if self.cp.nodes[n] == "skipped")
        strategy = compartment_strategy(spec.deployment_policy, name)
        cs.batch = evaluate_batch(strategy, cs.batch, succeeded, failed, active)
        view.batch_state = cs.batch
        batch_view.finished = workflow.now()
        if succeeded + failed:
            batch_view.success_percent = succeeded * 100 // (succeeded + failed)
        view.current_batch = None
        self._recent = ([*self._recent, batch_view])[-RECENT_BATCHES:]
        self.refresh()

    # ------------------------------------------------------------ the operator's controls

    async def pause(self, reason: str) -> None:
        self.paused_reason = reason
        await self._signal_batches("pause")

    async def resume(self) -> None:
        self.paused_reason = None
        await self._signal_batches("resume")

    async def abort(self, reason: str) -> None:
        self.aborted = reason
        await self._signal_batches("stop")

    def approve(self, compartment: str | None) -> None:
        self._approved.update([compartment] if compartment else sorted(self._awaiting_approval))

    def retry_node(self, node: str) -> None:
        if self.cp.nodes[node] == "erroring":
            cs = self._compartment_of(node)
            cs.batch = cs.batch.model_copy(update={"failed_nodes": max(0, cs.batch.failed_nodes - 1)})
        self._set_node(node, "waiting", "")

    def skip_node(self, node: str, reason: str) -> None:
        self._set_node(node, "skipped", f"skipped: {reason}")

    def reset_batch_state(self, compartment: str) -> None:
        self.cp.compartments[compartment].batch = BatchState()

    def require_active(self) -> None:
        if self.aborted is not None:
            raise ValueError(f"the {self.noun} is aborting: {self.aborted}")
        if self.phase in ("completed", "aborted", "planned", "planning", "surveying"):
            raise ValueError(f"the {self.noun} is {self.phase}")

    def require_node(self, node: str, states: tuple[str, ...], verb: str) -> None:
        """Refuse a control for a node not in the run or not in one of `states`."""
        if node not in self.cp.nodes:
            raise ValueError(f"node {node!r} is not part of this {self.noun}")
        status = self.cp.nodes[node]
        if status not in states:
            allowed = f"{', '.join(states[:-1])} or {states[-1]}"
            raise ValueError(f"node {node} is {status}; only {allowed} nodes can be {verb}")

    def awaiting_approval(self) -> set[str]:
        return self._awaiting_approval

    async def _signal_batches(self, signal: str) -> None:
        for handle in list(self._batches.values()):
            await handle.signal(signal)

    # ------------------------------------------------------------ state and visibility

    def _pending(self, cs: CompartmentState) -> list[str]:
        """Nodes a next batch may take: waiting and blocked ones, and erroring ones with retries left."""
        limit = self.spec.deployment_policy.retry_erroring_nodes if self.planning else 0
        return [
            n
            for n in cs.members
            if self.cp.nodes[n] in ("waiting", "blocked") or (limit and retryable(self.cp, n, limit))
        ]

    def _set_node(self, node: str, status: NodeStatus, reason: str) -> None:
        self.cp.nodes[node] = status
        if reason:
            self.cp.reasons[node] = reason
        else:
            self.cp.reasons.pop(node, None)

    def _compartment_of(self, node: str) -> CompartmentState:
        return next(cs for cs in self.cp.compartments.values() if node in cs.members)

    def _woken(self) -> bool:
        """A waiting compartment must look up: the run aborts or continues as new."""
        return self.aborted is not None or self.continuing

    def _interrupted(self) -> bool:
        """A compartment's wait ends: the run aborts, continues as new or pauses."""
        return self._woken() or self.paused_reason is not None

    async def _sleep(self, duration: timedelta, summary: str) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await workflow.wait_condition(self._interrupted, timeout=duration, timeout_summary=summary)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for status in self.cp.nodes.values():
            counts[status] = counts.get(status, 0) + 1
        return counts

    def _enter(self, view: CompartmentView, phase: CompartmentPhase, note: str) -> None:
        view.phase, view.note = phase, note
        self.refresh()

    def overall_phase(self) -> str:
        if self.phase != "running":
            return self.phase
        if self.aborted is not None:
            return "aborting"
        if self.paused_reason is not None:
            return "paused"
        if self._views and all(v.phase == "stopped" for v in self._views.values() if v.phase != "done"):
            return "stopped"
        return "running"

    def status(self) -> RolloutStatus:
        return RolloutStatus(
            phase=self.overall_phase(),
            paused_reason=self.paused_reason,
            aborted=self.aborted,
            counts=self.counts(),
            compartments=self._views,
            recent_batches=self._recent,
            problems={
                n: NodeView(
                    status=s,
                    reason=self.cp.reasons.get(n, ""),
                    stages=self._stage_details.get(n, []),
                    retries=self.cp.retries.get(n, 0),
                )
                for n, s in self.cp.nodes.items()
                if s in PROBLEM_STATES
            },
            joined=self.cp.joined,
            left=self.cp.left,
            **self.cp.cost.cost().model_dump(),
        )

    def progress(self) -> Progress:
        counts = self.counts()
        return Progress(
            phase=self.overall_phase(),
            done=sum(counts.get(s, 0) for s in ("complete", "erroring", "skipped")),
            total=len(self.cp.nodes),
            details=self._summary(),
            finished=self.phase in ("completed", "aborted", "planned"),
        )

    def refresh(self) -> None:
        """Current details, phase search attribute and metrics, from the state."""
        phase = self.overall_phase()
        if phase != self._upserted:  # each upsert is a history event
            publish_phase(phase, sa.CLUSTER.value_set(self.spec.cluster))
            self._upserted = phase
        workflow.set_current_details(self._summary())
        meter = workflow.metric_meter().with_additional_attributes({"rollout": workflow.info().workflow_id})
        nodes = meter.create_gauge("millwright_rollout_nodes", "Nodes of a rollout by state")
        for status in ("waiting", "in_progress", "complete", "erroring", "blocked", "skipped"):
            nodes.set(self.counts().get(status, 0), {"state": status})
        batch = meter.create_gauge("millwright_rollout_batch", "Current batch number per compartment")
        failures = meter.create_gauge("millwright_rollout_consecutive_failures", "Consecutive failed batches")
        for name, cs in self.cp.compartments.items():
            batch.set(cs.batch.current_batch, {"compartment": name})
            failures.set(cs.batch.consecutive_failures, {"compartment": name})

    def _summary(self) -> str:
        counts = self.counts()
        lines = [
            f"**{self.overall_phase()}** {self.noun} `{self.spec.name}` on `{self.spec.cluster}`: "
            f"{counts.get('complete', 0)}/{len(self.cp.nodes)} complete, {counts.get('in_progress', 0)} in progress, "
            f"{counts.get('erroring', 0)} erroring, {counts.get('blocked', 0)} blocked"
        ]
        if self.matched_no_node():  # else an empty count reads as a success
            lines.append(MATCHED_NO_NODE)
        if self.paused_reason:
            lines.append(f"paused: {self.paused_reason}")
        if self.aborted:
            lines.append(f"aborting: {self.aborted}")
        if self.cp.joined or self.cp.left:
            lines.append(f"membership: {len(self.cp.joined)} nodes joined, {len(self.cp.left)} left mid-{self.noun}")
        for view in self._views.values():
            lines.append(
                f"- `{view.name}` {view.phase} (batch {view.batch_state.current_batch}, ceiling {view.ceiling}): {view.note}"
            )
        # Why nodes failed (a stage, the validation gate), so a watcher sees it without the status query.
        erroring = [n for n, s in self.cp.nodes.items() if s == "erroring"]
        lines += [f"- node `{n}` erroring: {self.cp.reasons.get(n, '')[:300]}" for n in erroring[:PROBLEMS_SHOWN]]
        return "\n".join(lines)
