"""FleetHealthSweep (scheduled): find the unhealthy nodes and start one NodeRemediation each.

It reads every node's conditions, dcgm-exporter's GPU fault series in Prometheus (one query a slice; no
MILLWRIGHT_PROMETHEUS_URL: not used, and said), the host agents' GPU checks (no agent: unknown) and the BMCs'
health, decides with `workflows.remediation.policy.decide` (a node opted out by label, or remediated less than
`cooldown` ago, is skipped), and once every node of a cluster is decided starts at most `max_remediations`
children with the node-derived ID and `ParentClosePolicy.ABANDON` (they outlive the sweep) — none at all, and it
says why, while fewer than `min_healthy` of the cluster's nodes are healthy or its remediation circuit breaker is
tripped; a domain sick as a whole gets one RackRemediation instead of a NodeRemediation per node
(workflows/remediation/sweep_racks.py). A start that finds the node's remediation already
running (another sweep, a manual start) is reported as such, never duplicated; each child carries the sweep's cooldown
and what its decision saw of Millwright's marks (`decided_from`), which the child re-checks at its start. It reads and probes the nodes in
slice children of a few hundred nodes each and continues as new with a cursor, so that no run passes ~8,300
history events at 10,000 nodes (the class's docstring counts them).
How a node is probed and decided is in workflows/remediation/probes.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
)

from activities.entities import EntityActivities, RunOutcome, RunRef, WorkflowQuery, failed_outcome
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import DeviceInfo, DevicePage, DevicePageQuery, DeviceQuery
from activities.node_health import (
    NodeHealth,
    NodeHealthActivities,
    NodeHealthQuery,
    NodeNamesPage,
    NodeNamesQuery,
    NodesHealth,
    NodesHealthRequest,
)
from activities.prometheus import GpuFault
from workflows.budget import leases
from workflows.budget.breaker import BREAKER_QUERY, BreakerView
from workflows.common import priorities
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress, history_is_long
from workflows.common.call_options import API_CALL, API_RETRY, NETBOX_CALL
from workflows.common.carried import outcome_of
from workflows.common.endpoints import Endpoints, EndpointWait, kubernetes_api, with_waits
from workflows.common.errors import error_text
from workflows.remediation.escalation import RackTally
from workflows.remediation.models import DeviceFacts, NodeRemediationInput, device_facts
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.policy import (
    NodeDecision,
    remediation_workflow_id,
    too_few_healthy,
)
from workflows.remediation.probes import NodeProbes
from workflows.remediation.sweep_models import (
    HELD,
    LISTED,
    Candidate,
    ClusterSweep,
    FleetHealthSweepInput,
    FleetHealthSweepResult,
    SliceRun,
    StartedRemediation,
    SweepCursor,
    SweepSlice,
)
from workflows.remediation.sweep_racks import place_slice, start_racks

# ---------------------------------------------------------------- FleetHealthSweep

# Sweeps started before slices read every node in the one run; replays of them take that path (`_sweep_whole`).
SWEEP_SLICES_PATCH = "fleet-health-sweep-slices"
# Sweeps from before it started a slice's remediations as the slice closed; since, once the whole cluster is
# decided (min_healthy), after asking the cluster's circuit breaker.
SWEEP_HOLD_PATCH = "fleet-health-sweep-min-healthy-breaker"
BREAKER_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(seconds=15), schedule_to_close_timeout=timedelta(minutes=1),
                    retry_policy=API_RETRY)  # fmt: skip
SWEEP_HISTORY_LIMIT = 6000  # the sweep continues as new past this, or at the server's suggestion (4,096 events)
NAMES_PER_CALL = 5000  # node names one listing activity returns (~100 KB)
SLICE_TIMEOUT = timedelta(hours=6)  # a slice's execution timeout, far above what its probes' own bounds allow
NAMES_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(minutes=2), heartbeat_timeout=timedelta(seconds=30),
                  retry_policy=API_RETRY)  # fmt: skip
READ_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(minutes=5), heartbeat_timeout=timedelta(seconds=30),
                 retry_policy=API_RETRY)  # fmt: skip
# A slice reads dcgm-exporter's GPU faults in one query (sweeps started before it read none; workflows/remediation/
# probes.py bounds the query).
DCGM_PATCH = "fleet-health-sweep-dcgm"
# A domain over the escalation threshold gets one RackRemediation instead of a NodeRemediation per node (sweeps from
# before start a NodeRemediation each, and hold no more nodes than they may start).
ESCALATION_PATCH = "fleet-health-sweep-rack-escalation"


@workflow.defn
class FleetHealthSweep:
    """The sweep, in slices (a run of the same type per slice, so the worker registers nothing new):

    - The sweep lists each cluster's node names (`list_node_names`, 5,000 names an activity, in quick succession so
      that no continue token ages), sorts them and gives them out `slice_size` at a time to slice children
      (`<sweep ID>/slice-<first run>/<cluster>/<index>`, `ParentClosePolicy.ABANDON`), `slices_at_once` running at
      once. A slice reads its nodes by name (`read_nodes_health`, one activity), probes each node's host agent and
      BMC at once, decides, and returns counts, the unhealthy nodes and the nodes to remediate (with their BMC and
      GPUs). The sweep merges each slice as it closes, holds its nodes to remediate, and once the cluster's nodes are
      all decided checks min_healthy and the cluster's circuit breaker (one query, a local activity) and starts
      the remediations (`remediation/<cluster>/<node>`: a node whose remediation runs is reported
      `already-running`, never started twice), at most `max_remediations` in all.
    - Past `SWEEP_HISTORY_LIMIT` events (or the server's suggestion) the sweep continues as new with a cursor (the
      cluster, the last node given out, the next slice's index), the merged result and the running slices by ID;
      the next run lists the cluster again, skips the nodes given out, and waits for the carried slices through
      `EntityActivities.workflow_outcome` (workflows/common/carried.py) while it starts the next ones: slices keep probing
      across the boundary.

    History events (counted from the commands; bench/sweep.py measures them):
    - a slice of S nodes: start and read ~12, NetBox ~6, GPU faults from Prometheus ~6 (one query whatever S; its
      patch marker and search attribute), per node the GPU check (scheduled, started, completed;
      or scheduled and timed out) and the BMC read (3), each completion at worst its own workflow task (3): ≤ 12
      events a node, ≤ 3,018 for S = 250 (≤ 6,018 for the largest slice, 500);
    - the sweep: ~10 per slice (child initiated, started, completed; two workflow tasks), ~6 per 5,000 names
      listed, ≤ 9 per remediation started, ~60 per continue-as-new (carried slices awaited, the listing again).
    At 10,000 nodes (one cluster, S = 250): 40 slices of ≤ 3,018 events; the sweep ~40 × 10 + 2 × 6 + 20 ≈ 430
    plus 9 per remediation started (it continues as new past 6,000, or 4,096 at the server's suggestion, and
    one cluster's starts, HELD at most, add 250 × 9 = 2,250): no run passes ~8,300 events, and about 12 events a
    node in all.
    """

    @workflow.init
    def __init__(self, inp: FleetHealthSweepInput) -> None:
        self._inp = inp
        self._phases = Phases(finished=("completed", "failed"))
        self._calls = Endpoints(
            inp.retry_timeout, shown=self._waiting, priority=priorities.remediation(inp.clusters[0])
        )  # a slice: its cluster
        self._cursor = inp.carried or SweepCursor(result=FleetHealthSweepResult(clusters=[]))
        self._result = self._cursor.result
        self._running: dict[str, SliceRun] = {r.workflow_id: r for r in self._cursor.running}
        self._closed: list[tuple[SliceRun, FleetHealthSweepResult | str]] = []  # closed slices, not merged yet
        self._waits: set[asyncio.Task] = set()
        self._names: list[str] | None = None  # the current cluster's names not given out yet, listed by this run
        self._hold = False  # SWEEP_HOLD_PATCH: remediations start once their cluster is wholly decided
        self._progressed = False  # this run started or merged a slice (so continuing as new moves on)
        self._probes = NodeProbes(inp)

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.query(description="What the sweep found so far and what it started or skipped.")
    def status(self) -> FleetHealthSweepResult:
        return self._result

    @workflow.run
    async def run(self, inp: FleetHealthSweepInput) -> FleetHealthSweepResult:
        if inp.part is not None:
            return await self._sweep_slice(inp.part)
        if len(inp.clusters) == 1:
            workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.clusters[0])])
        if inp.carried is None and not workflow.patched(SWEEP_SLICES_PATCH):
            return await self._sweep_whole(inp)
        self._hold = workflow.patched(SWEEP_HOLD_PATCH)
        if inp.carried is None:  # decided once: a run carried across continue-as-new keeps its first run's answer
            self._cursor.escalation = self._hold and inp.escalation.enabled and workflow.patched(ESCALATION_PATCH)
        for ref in self._running.values():  # slices a previous run started
            self._wait(ref, self._carried_outcome(ref))
        self._enter("sweeping", self._summary_line())
        while True:
            while len(self._running) < inp.slices_at_once and (part := await self._next_slice()) is not None:
                await self._start_slice(part)
            if self._hold:
                await self._start_decided()
            if not self._running:
                break
            if self._progressed and history_is_long(SWEEP_HISTORY_LIMIT):
                await workflow.wait_condition(workflow.all_handlers_finished)
                self._cursor.running = list(self._running.values())
                workflow.continue_as_new(inp.model_copy(update={"carried": self._cursor}))
            await workflow.wait_condition(lambda: bool(self._closed))
            while self._closed:
                await self._merge(*self._closed.pop(0))
        self._enter("completed", self._summary_line())
        return self._result

    # ------------------------------------------------------------ giving out slices

    async def _next_slice(self) -> SweepSlice | None:
        inp, cursor = self._inp, self._cursor
        while cursor.cluster < len(inp.clusters):
            cluster = inp.clusters[cursor.cluster]
            if self._names is None:
                self._names = await self._list_names(cluster)
            if self._names:
                nodes, self._names = self._names[: inp.slice_size], self._names[inp.slice_size :]
                part = SweepSlice(cluster=cluster, index=cursor.next_slice, nodes=nodes)
                cursor.next_slice, cursor.after = cursor.next_slice + 1, nodes[-1]
                return part
            cursor.cluster, cursor.after, self._names = cursor.cluster + 1, None, None
        return None

    async def _list_names(self, cluster: str) -> list[str]:
        """The cluster's node names after the cursor, sorted (so the cursor holds whatever the API's order)."""
        sweep = self._cluster(cluster)
        names: list[str] = []
        token: str | None = None
        self._enter("sweeping", f"listing the nodes of {cluster}")
        try:
            while True:
                page: NodeNamesPage = await self._calls.execute(
                    NodeHealthActivities.list_node_names,
                    NodeNamesQuery(cluster=cluster, label_selector=self._inp.label_selector, max_names=NAMES_PER_CALL,
                                   continue_token=token),
                    **NAMES_CALL, endpoint=kubernetes_api(cluster), priority=priorities.remediation(cluster),
                    summary=f"list node names of {cluster}")  # fmt: skip
                names += page.names
                token = page.continue_token
                if not token:
                    break
        except (ActivityError, ApplicationError) as err:
            sweep.error = error_text(err)
            return []
        after = self._cursor.after
        return sorted(n for n in set(names) if after is None or n > after)

    async def _start_slice(self, part: SweepSlice) -> None:
        inp, info = self._inp, workflow.info()
        workflow_id = f"{info.workflow_id}/slice-{info.first_execution_run_id[:8]}/{part.cluster}/{part.index:04d}"
        child = inp.model_copy(update={"clusters": [part.cluster], "part": part, "carried": None,
                                       "bmcs": {n: inp.bmcs[n] for n in part.nodes if n in inp.bmcs}})  # fmt: skip
        handle = await workflow.start_child_workflow(
            FleetHealthSweep.run, child, id=workflow_id, task_queue=info.task_queue,
            # A slice outlives this run when it continues as new; the next run waits for it by ID.
            parent_close_policy=workflow.ParentClosePolicy.ABANDON, execution_timeout=SLICE_TIMEOUT,
            priority=priorities.remediation(part.cluster),
            search_attributes=TypedSearchAttributes([SearchAttributePair(sa.CLUSTER, part.cluster)]),
            static_summary=f"sweep {len(part.nodes)} nodes of {part.cluster}: {part.nodes[0]} … {part.nodes[-1]}"[:200],
        )  # fmt: skip
        ref = SliceRun(workflow_id=workflow_id, run_id=handle.first_execution_run_id or "", cluster=part.cluster,
                       index=part.index, nodes=len(part.nodes), first=part.nodes[0], last=part.nodes[-1])  # fmt: skip
        self._running[workflow_id] = ref
        self._progressed = True
        sweep = self._cluster(part.cluster)
        sweep.nodes += len(part.nodes)
        sweep.slices += 1

        async def closed() -> FleetHealthSweepResult | str:
            try:
                return await handle
            except ChildWorkflowError as err:
                return _outcome_error(failed_outcome(err.cause))

        self._wait(ref, closed())
        self._details()

    async def _carried_outcome(self, ref: SliceRun) -> FleetHealthSweepResult | str:
        outcome = await outcome_of(RunRef(workflow_id=ref.workflow_id, run_id=ref.run_id), longest=SLICE_TIMEOUT,
                                   summary=f"slice {ref.index} of {ref.cluster}: {ref.first} … {ref.last}")  # fmt: skip
        if outcome.status != "completed":
            return _outcome_error(outcome)
        return FleetHealthSweepResult.model_validate(outcome.result)

    def _wait(self, ref: SliceRun, outcome: Any) -> None:
        async def wait() -> None:
            self._closed.append((ref, await outcome))

        task = asyncio.create_task(wait())
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    async def _merge(self, ref: SliceRun, outcome: FleetHealthSweepResult | str) -> None:
        """One closed slice into the result; then start the remediations it found."""
        del self._running[ref.workflow_id]
        self._progressed = True
        sweep = self._cluster(ref.cluster)
        if isinstance(outcome, str):
            self._add_error(sweep, f"slice {ref.index} ({ref.nodes} nodes, {ref.first} … {ref.last}) not swept: "
                                   f"{outcome}")  # fmt: skip
            self._details()
            return
        (part,) = outcome.clusters
        sweep.healthy += part.healthy
        sweep.not_healthy += part.not_healthy
        sweep.agents_unavailable += part.agents_unavailable
        sweep.bmc_unknown += part.bmc_unknown
        sweep.vanished += part.vanished
        sweep.gpu_faults += part.gpu_faults
        sweep.dcgm = part.dcgm if part.dcgm.startswith("not read") or not sweep.dcgm else sweep.dcgm
        if self._cursor.escalation:
            racks = self._cursor.racks.setdefault(ref.cluster, {})
            for key, seen in outcome.racks.items():
                racks.setdefault(key, RackTally()).add(seen)
        room = LISTED - sum(len(c.unhealthy) for c in self._result.clusters)
        sweep.unhealthy += part.unhealthy[: max(room, 0)]
        if part.error:
            self._add_error(sweep, f"slice {ref.index} ({ref.first} … {ref.last}): {part.error}")
        self._details()
        if self._hold:
            self._hold_found(outcome.found)
        else:
            await self._start(outcome.found)

    def _hold_found(self, found: list[Candidate]) -> None:
        """Keep a slice's nodes to remediate until their cluster is wholly decided; past what could be started
        (max_remediations, at most HELD held), deferred at once."""
        cursor, inp = self._cursor, self._inp
        # Escalating, a domain's nodes are held together: max_remediations defers NodeRemediations at their start.
        room = HELD if inp.dry_run or cursor.escalation else min(HELD, inp.max_remediations - cursor.started)
        room -= len(cursor.held)
        cursor.held += found[: max(room, 0)]
        for candidate in found[max(room, 0) :]:
            why = f"max {inp.max_remediations} remediations per sweep"
            if len(cursor.held) >= HELD and cursor.started + HELD < inp.max_remediations:
                why = f"more than {HELD} nodes to remediate at once: left to the next sweep"
            self._record(self._entry(candidate, "dry-run" if inp.dry_run else "deferred", why))

    async def _start_decided(self) -> None:
        """Start (or refuse) the held remediations of every cluster whose nodes are all decided: all given out to
        slices, none of those still running."""
        cursor, inp = self._cursor, self._inp
        running = {r.cluster for r in self._running.values()}
        for cluster in inp.clusters[: cursor.cluster]:
            if cluster in running:
                continue
            racks = cursor.racks.pop(cluster, {})
            found = [c for c in cursor.held if c.cluster == cluster]
            if not found:
                continue
            cursor.held = [c for c in cursor.held if c.cluster != cluster]
            sweep = self._cluster(cluster)
            sweep.refused = too_few_healthy(sweep.healthy, sweep.healthy + sweep.not_healthy,
                                            inp.min_healthy) or await self._breaker_tripped(cluster)  # fmt: skip
            if cursor.escalation and sweep.refused is None:
                escalated, found = await start_racks(cluster, found, racks, inp)
                for members, status, detail, wf_id in escalated:
                    for candidate in members:
                        self._record(self._entry(candidate, status, detail, workflow_id=wf_id))
            await self._start(found, refused=sweep.refused)

    async def _breaker_tripped(self, cluster: str) -> str | None:
        """Why the cluster's remediation circuit breaker forbids remediating (tripped, or unreadable: fail
        closed); None when it is closed or the cluster's disruption budget does not run."""
        try:
            raw = await workflow.execute_local_activity_method(
                EntityActivities.query_running, WorkflowQuery(workflow_id=leases.budget_workflow_id(cluster),
                                                              query=BREAKER_QUERY),
                **BREAKER_CALL, summary=f"the circuit breaker of {cluster}")  # fmt: skip
        except ActivityError as err:
            return f"the circuit breaker of {cluster} could not be read ({error_text(err)}): no remediation, to be safe"
        view = BreakerView.model_validate(raw) if raw is not None else None
        return view.line() if view is not None and view.tripped else None

    def _cluster(self, cluster: str) -> ClusterSweep:
        found = next((c for c in self._result.clusters if c.cluster == cluster), None)
        if found is None:
            found = ClusterSweep(cluster=cluster)
            self._result.clusters.append(found)
        return found

    @staticmethod
    def _add_error(sweep: ClusterSweep, error: str) -> None:
        sweep.error = (f"{sweep.error}; {error}" if sweep.error else error)[:2000]

    # ------------------------------------------------------------ one slice

    async def _sweep_slice(self, part: SweepSlice) -> FleetHealthSweepResult:
        inp = self._inp
        sweep = ClusterSweep(cluster=part.cluster, nodes=len(part.nodes), slices=1)
        self._result = FleetHealthSweepResult(clusters=[sweep])
        self._enter("reading", f"{len(part.nodes)} nodes of {part.cluster}: {part.nodes[0]} … {part.nodes[-1]}")
        try:
            facts = await self._netbox_facts_of(part.nodes) if inp.netbox else {}
            read: NodesHealth = await self._calls.execute(
                NodeHealthActivities.read_nodes_health,
                NodesHealthRequest(cluster=part.cluster, nodes=part.nodes, condition_types=inp.checks.condition_types(),
                                   label_keys=inp.checks.label_keys() + inp.escalation.label_keys()),
                **READ_CALL, endpoint=kubernetes_api(part.cluster),
                summary=f"read {len(part.nodes)} nodes of {part.cluster}")  # fmt: skip
        except (ActivityError, ApplicationError) as err:
            sweep.error = error_text(err)
            self._enter("failed", sweep.error)
            return self._result
        sweep.vanished = len(read.missing)
        dcgm: dict[str, list[GpuFault]] | None = None
        if not inp.checks.dcgm.enabled:
            sweep.dcgm = "not used: checks.dcgm.enabled is false"
        elif workflow.patched(DCGM_PATCH):
            dcgm = await self._probes.dcgm_faults(part, sweep)
        self._enter("probing", f"{len(read.nodes)} nodes of {part.cluster}")
        found = await self._probes.look_all(part.cluster, read.nodes, facts, sweep, together=True, dcgm=dcgm)
        self._result.found = [Candidate(cluster=c, decision=d, facts=f) for c, d, f in found]
        if inp.escalation.enabled:
            place_slice(self._result, read.nodes, inp, dcgm, workflow.now())
        self._enter("completed", f"{sweep.healthy} healthy, {sweep.not_healthy} not, {len(found)} to remediate")
        return self._result

    async def _netbox_facts_of(self, names: list[str]) -> dict[str, DeviceFacts]:
        facts: dict[str, DeviceFacts] = {}
        after: int | None = 0
        while after is not None:
            page: DevicePage = await self._calls.execute(
                NetBoxActivities.list_devices_page,
                DevicePageQuery(role=self._inp.netbox_role, names=names, after_id=after, limit=1000), **NETBOX_CALL,
                summary=f"NetBox: {len(names)} devices")  # fmt: skip
            facts |= {d.name: device_facts(d) for d in page.devices if d.name}
            after = page.next_after_id
        return facts

    # ------------------------------------------------------------ starting remediations

    async def _start(self, found: list[Candidate], phase: str | None = None, refused: str | None = None) -> None:
        """Start a NodeRemediation for each node found, until max_remediations; record what became of each
        (`phase`: the phase each start shows; `refused`: why none may start)."""
        inp = self._inp
        for candidate in found:
            decision, facts = candidate.decision, candidate.facts
            entry = self._entry(candidate, "deferred")
            wf_id = entry.workflow_id
            if refused is not None:
                entry.status, entry.detail = "refused", refused
            elif inp.dry_run:
                entry.status = "dry-run"
            elif self._cursor.started >= inp.max_remediations:
                entry.detail = f"max {inp.max_remediations} remediations per sweep"
            else:
                settings = inp.remediation.model_dump()
                settings["expected_gpus"] = facts.gpus if facts.gpus is not None else settings["expected_gpus"]
                settings["gpu_model"] = facts.gpu_model or settings["gpu_model"]
                child = NodeRemediationInput(
                    cluster=candidate.cluster, node=decision.node, reason="; ".join(decision.reasons)[:1024],
                    checks=inp.checks, bmc=facts.bmc, cooldown=inp.cooldown, decided_from=decision.decided_from,
                    **{**settings, "netbox": settings["netbox"] or inp.netbox})  # fmt: skip
                try:
                    await workflow.start_child_workflow(
                        NodeRemediation.run, child, id=wf_id, task_queue=workflow.info().task_queue,
                        parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                        priority=priorities.remediation(candidate.cluster),
                        # A finished remediation may run again; a running one is never started twice.
                        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                        search_attributes=TypedSearchAttributes(child.search_attributes()),
                        static_summary=f"remediate {decision.node}: {child.reason}"[:200],
                    )  # fmt: skip
                except WorkflowAlreadyStartedError:
                    entry.status, entry.detail = "already-running", "a remediation of this node is already running"
                else:
                    entry.status = "started"
                    self._cursor.started += 1
            self._record(entry)
            if phase is not None and entry.status == "started":
                self._enter(phase, decision.node, done=self._cursor.started)
        self._details()

    @staticmethod
    def _entry(candidate: Candidate, status: str, detail: str = "", workflow_id: str = "") -> StartedRemediation:
        node = candidate.decision.node
        return StartedRemediation(cluster=candidate.cluster, node=node, reasons=candidate.decision.reasons,
                                  workflow_id=workflow_id or remediation_workflow_id(candidate.cluster, node),
                                  status=status, detail=detail)  # fmt: skip

    def _record(self, entry: StartedRemediation) -> None:
        r = self._result
        r.remediation_counts[entry.status] = r.remediation_counts.get(entry.status, 0) + 1
        if len(r.remediations) < LISTED:
            r.remediations.append(entry)

    # ------------------------------------------------------------ sweeps started before slices

    async def _sweep_whole(self, inp: FleetHealthSweepInput) -> FleetHealthSweepResult:
        """Every cluster read and probed in this one run (a sweep from before `SWEEP_SLICES_PATCH`, replayed)."""
        found: list[Candidate] = []
        for n, cluster in enumerate(inp.clusters):
            self._enter("reading", f"cluster {cluster}", done=n, total=len(inp.clusters))
            sweep = self._cluster(cluster)
            try:
                found += [
                    Candidate(cluster=c, decision=d, facts=f) for c, d, f in await self._read_whole(cluster, sweep)
                ]
            except (ActivityError, ApplicationError) as err:
                sweep.error = error_text(err)
            self._details()
        self._enter("starting-remediations", done=0, total=min(len(found), inp.max_remediations))
        await self._start(found, phase="starting-remediations")
        self._enter("completed", self._summary_line())
        return self._result

    async def _read_whole(self, cluster: str, sweep: ClusterSweep) -> list[tuple[str, NodeDecision, DeviceFacts]]:
        inp = self._inp
        facts = await self._netbox_facts() if inp.netbox else {}
        nodes: list[NodeHealth] = []
        token: str | None = None
        while True:
            page = await self._calls.execute(
                NodeHealthActivities.list_node_health,
                NodeHealthQuery(cluster=cluster, label_selector=inp.label_selector, continue_token=token,
                                condition_types=inp.checks.condition_types(), label_keys=inp.checks.label_keys()),
                **API_CALL, endpoint=kubernetes_api(cluster), summary=f"list nodes of {cluster}")  # fmt: skip
            nodes += page.nodes
            token = page.continue_token
            if not token:
                break
        sweep.nodes = len(nodes)
        return await self._probes.look_all(cluster, nodes, facts, sweep, together=False)

    async def _netbox_facts(self) -> dict[str, DeviceFacts]:
        devices: list[DeviceInfo] = await self._calls.execute(
            NetBoxActivities.list_devices, DeviceQuery(role=self._inp.netbox_role, limit=10000), **NETBOX_CALL,
            summary="NetBox: list devices")  # fmt: skip
        return {d.name: device_facts(d) for d in devices if d.name}

    # ------------------------------------------------------------ visibility

    def _enter(self, phase: str, details: str = "", done: int | None = None, total: int | None = None) -> None:
        self._phases.enter(phase, details, done=done, total=total)
        self._details()

    def _waiting(self, waits: list[EndpointWait]) -> None:
        self._phases.progress.waiting = waits
        self._details()

    def _summary_line(self) -> str:
        r = self._result
        nodes = sum(c.nodes for c in r.clusters)
        not_healthy = sum(c.not_healthy for c in r.clusters)
        by = {s: r.remediation_counts.get(s, 0) for s in ("started", "already-running", "deferred", "refused",
                                                          "escalated")}  # fmt: skip
        line = (f"{nodes} nodes, {not_healthy} not healthy; started {by['started']}, already running "
                f"{by['already-running']}, deferred {by['deferred']}")  # fmt: skip
        if by["escalated"]:
            line += f", escalated to their domain's RackRemediation {by['escalated']}"
        if by["refused"]:
            line += f", refused {by['refused']}"
        if self._inp.part is None and self._phases.progress.phase != "completed" and self._running:
            line += f"; {len(self._running)} slices running"
        return line

    def _details(self) -> None:
        r = self._result
        if self._inp.part is None and self._phases.progress.phase == "sweeping":
            self._phases.progress.done = sum(c.healthy + c.not_healthy + c.vanished for c in r.clusters)
            self._phases.progress.total = sum(c.nodes for c in r.clusters)
        lines = [f"**{self._phases.progress.phase}** {self._summary_line()}"]
        for c in r.clusters:
            head = f"`{c.cluster}`: {c.nodes} nodes, {c.healthy} healthy"
            if c.agents_unavailable:
                head += f", {c.agents_unavailable} without a host agent"
            if c.refused:
                head += f", **no remediation**: {c.refused}"
            if c.dcgm:
                head += f", GPU faults {c.dcgm}" + (f" ({c.gpu_faults} series)" if c.gpu_faults else "")
            if c.error:
                head += f", error: {c.error}"
            lines.append(head)
            lines += [f"- {d}" for d in c.unhealthy[:50]]
        for s in r.remediations[:50]:
            lines.append(f"- {s.status}: `{s.workflow_id}`" + (f" ({s.detail})" if s.detail else ""))
        workflow.set_current_details(with_waits("\n\n".join(lines), self._phases.progress.waiting))


def _outcome_error(outcome: RunOutcome) -> str:
    why = outcome.causes[-1].message if outcome.causes else "no reason given"
    return f"{outcome.status}: {why}"
