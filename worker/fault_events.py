"""The event path to remediation: a node's fault acted on in seconds, beside the FleetHealthSweep (the backstop).

Two sources report faults: Alertmanager's webhook (worker/alert_receiver.py) and a watch on each cluster's Nodes
(worker/node_watch.py). `FaultEvents` holds a fault the watch saw for `hold` (a condition that clears within it,
flapping, starts nothing and is counted `flapped`), then reads the node afresh and decides with the sweep's own
policy (`decide`: quarantined, opted out, cooling down or cordoned by someone else is `ignored`, with why), checks
the cluster's `min_healthy` over the watch's view of the cluster and its circuit breaker (`refused`, with why), and
starts `NodeRemediation` with the node-derived ID the sweep uses (`remediation/<cluster>/<node>`): a node whose
remediation runs is `already-running`, never started twice. The node's BMC is resolved as the sweep resolves it
(the settings' `bmcs`, else NetBox with remediation.netbox), and the outcome says when none is known. The
remediation takes its lease from the cluster's disruption budget and re-checks the node at its start, as a sweep's
child does. A node of an NVLink domain sick as a whole (`escalation`, workflows/remediation/escalation.py, judged on
the watch's view of the domain) starts one RackRemediation for the domain instead (`escalated`), and a node of a
domain whose RackRemediation runs is left to it (`escalated`, never a NodeRemediation).

Everything here is a side effect of the worker process (the Temporal client, the Kubernetes API); the decisions are
the pure functions of workflows/remediation/policy.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import Field
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.entities import WorkflowQuery, query_running
from activities.kube.connector import REQUEST_TIMEOUT, ClusterConnector
from activities.kube.stages import read_json
from activities.kube.topology import NodePlace, place_of, rack_key
from activities.models import StrictModel
from activities.node_health import NodeHealth, node_health
from activities.redfish import BmcRef
from workflows.budget import leases
from workflows.budget.breaker import BREAKER_QUERY, BreakerView
from workflows.common import priorities
from workflows.remediation.escalation import Escalation, FaultyNode, RackEscalation, escalations, fabric_signs, tally
from workflows.remediation.models import NodeRemediationInput, RemediationSettings, server_facts
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.policy import (
    DEFAULT_COOLDOWN,
    HealthChecks,
    MinHealthy,
    decide,
    node_problems,
    too_few_healthy,
)
from workflows.remediation.rack_models import RackRemediationInput, rack_workflow_id

log = logging.getLogger("millwright.fault_events")

RECENT = 200  # outcomes kept for GET /events
BREAKER_TIMEOUT = 10.0  # seconds to read a cluster's circuit breaker before refusing, to be safe
# escalated: the node's whole NVLink domain is remediated by one RackRemediation (started now, or running).
Status = Literal["started", "already-running", "ignored", "refused", "healthy", "flapped", "error", "escalated"]
RACK_WORKFLOW = "RackRemediation"  # started by name: workflows/remediation/rack_remediation.py


class FaultEventSettings(StrictModel):
    """What the event path decides and starts with (MILLWRIGHT_FAULT_EVENTS_SETTINGS, a JSON file; all defaulted)."""

    hold: timedelta = Field(timedelta(seconds=5), description="A fault the watch sees must last this long before a "
                            "remediation starts; one that clears sooner (flapping) starts nothing. It replaces "
                            "checks.not_ready_grace on this path.")  # fmt: skip
    alert_hold: timedelta = Field(timedelta(0), description="The same for an alert: Alertmanager's own `for:` and "
                                  "group_wait have debounced it already.")  # fmt: skip
    checks: HealthChecks = Field(default_factory=HealthChecks, description="What counts as a fault on the node "
                                 "object, as the sweep's checks (its node-object part).")  # fmt: skip
    cooldown: timedelta = Field(DEFAULT_COOLDOWN, description="As the sweep's cooldown.")
    min_healthy: MinHealthy = Field(default_factory=lambda: MinHealthy(percent=51), description="As the sweep's, over the watch's view "
                                    "of the cluster's nodes.")  # fmt: skip
    remediation: RemediationSettings = Field(default_factory=RemediationSettings,
                                             description="The NodeRemediation each start runs with.")  # fmt: skip
    bmcs: dict[str, BmcRef] = Field(default_factory=dict, description="BMC per node name, as the sweep's `bmcs` "
                                    "(before NetBox's, which the remediation looks up with remediation.netbox); "
                                    "credentials as secret references.")  # fmt: skip
    escalation: RackEscalation = Field(default_factory=RackEscalation, description="As the sweep's: when a node's "
                                       "whole NVLink domain is remediated (one RackRemediation) instead.")  # fmt: skip


class FaultOutcome(StrictModel):
    cluster: str
    node: str
    source: str = Field(description="What reported the fault: `watch` or `alert <alertname>`.")
    status: Status
    detail: str = ""
    workflow_id: str = ""
    bmc: str = Field("", description="Where a started remediation's BMC comes from, or that none is known (it "
                     "cannot power-cycle).")  # fmt: skip
    at: datetime


class FaultEvents:
    """Faults in, NodeRemediations out; the watch's view of each watched cluster (`book`)."""

    def __init__(self, client: Client, connector: ClusterConnector, task_queue: str, settings: FaultEventSettings,
                 clusters: list[str]) -> None:  # fmt: skip
        self._client, self._connector, self._task_queue = client, connector, task_queue
        self.settings = settings
        # The hold stands in for the NotReady grace: a NotReady node held `hold` is a fault.
        self._checks = settings.checks.model_copy(update={"not_ready_grace": timedelta(0)})
        self.book: dict[str, dict[str, NodeHealth]] = {c: {} for c in clusters}
        self.heard: dict[str, datetime | None] = {c: None for c in clusters}  # the watch's last event or bookmark
        self.counts: collections.Counter[str] = collections.Counter()
        self.recent: collections.deque[FaultOutcome] = collections.deque(maxlen=RECENT)
        self._held: dict[tuple[str, str], asyncio.Task] = {}
        # Faults the watch acted on (or holds), until it sees the node without one: the remediation's own writes on
        # a still-faulty node start nothing more.
        self._acted: set[tuple[str, str]] = set()
        self._faulty_since: dict[tuple[str, str], datetime] = {}  # when the watch first saw each node's fault
        # rack -> NVLink domain as the watch saw it: a fault that hides every clique label of a rack at once does
        # not hide which domain the rack is.
        self._domains: dict[str, dict[str, str]] = {c: {} for c in clusters}

    @property
    def condition_types(self) -> list[str]:
        return self._checks.condition_types()

    @property
    def label_keys(self) -> list[str]:
        return self._checks.label_keys() + self.settings.escalation.label_keys()

    # ------------------------------------------------------------ from the watch

    def listed(self, cluster: str, nodes: list[NodeHealth]) -> None:
        """The watch (re)listed the cluster: its view replaced, every node looked at."""
        self.book[cluster] = {}
        for node in nodes:
            self.seen(cluster, node)

    def seen(self, cluster: str, node: NodeHealth) -> None:
        """A node added or changed: a fault starts its hold; a fault gone within the hold is flapping."""
        self.book[cluster][node.name] = node
        key = (cluster, node.name)
        faulty = bool(node_problems(node, self._checks, node.decided_at(_now()))[0])  # a quarantine is no new fault
        place = self._place(node)
        if place.rack and not place.own_domain:
            self._domains[cluster][place.rack] = place.domain
        if not faulty:
            self._acted.discard(key)
            self._faulty_since.pop(key, None)
        else:
            self._faulty_since.setdefault(key, _now())
        if faulty and key not in self._held and key not in self._acted:
            self._acted.add(key)
            self._hold(cluster, node.name)
        elif not faulty and key in self._held:
            self._held.pop(key).cancel()
            self._record(FaultOutcome(cluster=cluster, node=node.name, source="watch", status="flapped",
                                      detail=f"the fault cleared within the {self.settings.hold} hold",
                                      at=_now()))  # fmt: skip

    def gone(self, cluster: str, name: str) -> None:
        self.book[cluster].pop(name, None)
        self._acted.discard((cluster, name))
        self._faulty_since.pop((cluster, name), None)
        held = self._held.pop((cluster, name), None)
        if held is not None:
            held.cancel()

    # ------------------------------------------------------------ from an alert

    async def alert(self, cluster: str, node: str, source: str, problem: str) -> FaultOutcome:
        """An alert firing for `node`: acted on after `alert_hold` (none by default), its outcome returned."""
        if cluster not in self.book:
            return self._record(FaultOutcome(cluster=cluster, node=node, source=source, status="refused",
                                             detail=f"cluster {cluster!r} is not one this worker watches "
                                                    f"({', '.join(self.book)}): no min_healthy view of it",
                                             at=_now()))  # fmt: skip
        # Held in the request (Alertmanager waits for the answer), not among the watch's holds: the node object
        # showing no fault does not clear an alert.
        await asyncio.sleep(self.settings.alert_hold.total_seconds())
        return await self._act(cluster, node, source, [problem])

    # ------------------------------------------------------------ acting

    def _hold(self, cluster: str, node: str) -> None:
        """The watch's fault on `node`, acted on after the hold unless `seen` cancels it first."""
        key = (cluster, node)

        async def held() -> FaultOutcome:
            await asyncio.sleep(self.settings.hold.total_seconds())
            try:
                return await self._act(cluster, node, "watch", [])
            except Exception as err:  # nobody awaits a watch's hold: said here, never lost
                return self._record(FaultOutcome(cluster=cluster, node=node, source="watch", status="error",
                                                 detail=repr(err)[:1000], at=_now()))  # fmt: skip
            finally:
                if self._held.get(key) is task:
                    del self._held[key]

        task = asyncio.create_task(held(), name=f"fault {cluster}/{node}")
        self._held[key] = task

    async def _act(self, cluster: str, name: str, source: str, reported: list[str]) -> FaultOutcome:
        def outcome(status: Status, detail: str = "", workflow_id: str = "", bmc: str = "") -> FaultOutcome:
            return self._record(FaultOutcome(cluster=cluster, node=name, source=source, status=status,
                                             detail=detail[:1000], workflow_id=workflow_id, bmc=bmc,
                                             at=_now()))  # fmt: skip

        try:
            node = await self._read(cluster, name)
        except Exception as err:
            return outcome("error", f"reading the node: {err}")
        if node is None:
            return outcome("ignored", f"no node {name!r} in cluster {cluster!r}")
        decision = decide(cluster, node, self._checks, node.decided_at(_now()), cooldown=self.settings.cooldown,
                          reported=reported)  # fmt: skip
        if decision.action == "healthy":
            return outcome("healthy", "no fault left when the hold ended")
        rack = rack_key(self._place(node)) if self.settings.escalation.enabled else None
        if rack is not None:  # a node of a domain remediated whole is left to that run, whatever else it shows
            rack_id = rack_workflow_id(cluster, rack)
            try:
                running = await self._running(rack_id)
            except RPCError as err:
                return outcome("error", f"asking whether {rack_id} runs: {err}", rack_id)
            if running:
                return outcome("escalated", f"its domain is remediated whole by {rack_id}", rack_id)
        if decision.action == "skip":
            return outcome("ignored", f"{'; '.join(decision.reasons)}: {decision.note}")
        book = self.book[cluster]
        healthy = sum(
            1 for n in book.values() if decide(cluster, n, self._checks, n.decided_at(_now())).action == "healthy"
        )
        refused = too_few_healthy(healthy, len(book), self.settings.min_healthy) or await self._breaker(cluster)
        if refused:
            return outcome("refused", refused)
        if rack is not None and (whole := self._escalation(cluster, node, rack)) is not None:
            return await self._start_rack(cluster, whole, outcome)
        settings = self.settings
        bmc = server_facts(name, settings.bmcs).bmc
        inp = NodeRemediationInput(cluster=cluster, node=name, reason=_reason(source, decision.reasons),
                                   checks=settings.checks, cooldown=settings.cooldown,
                                   decided_from=decision.decided_from, bmc=bmc,
                                   **settings.remediation.model_dump())  # fmt: skip
        try:
            await self._client.start_workflow(
                NodeRemediation.run, inp, id=inp.workflow_id(), task_queue=self._task_queue,
                # A finished remediation may run again; a running one is never started twice.
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE, priority=priorities.remediation(cluster),
                search_attributes=TypedSearchAttributes(inp.search_attributes()), static_summary=f"remediate {name}: {inp.reason}"[:200])  # fmt: skip
        except WorkflowAlreadyStartedError:
            return outcome("already-running", "a remediation of this node is already running", inp.workflow_id())
        except RPCError as err:
            return outcome("error", f"starting the remediation: {err}", inp.workflow_id())
        return outcome("started", inp.reason, inp.workflow_id(), self._bmc_source(bmc))

    def _place(self, node: NodeHealth) -> NodePlace:
        return place_of(node.name, node.labels, self.settings.escalation.topology)

    def _escalation(self, cluster: str, fresh: NodeHealth, rack: str) -> Escalation | None:
        """Whether `fresh`'s domain (`rack`) is remediated whole, judged on the watch's view of the cluster, with
        `fresh` (read now, with the fault the hold or an alert found) in it."""
        now = _now()
        places: list[tuple[NodePlace, bool]] = []
        faulty: list[FaultyNode] = []
        for node in {**self.book[cluster], fresh.name: fresh}.values():
            place = self._place(node)
            unhealthy = node is fresh or decide(cluster, node, self._checks, node.decided_at(now)).action != "healthy"
            places.append((place, unhealthy))
            if unhealthy and rack_key(place) == rack:
                signs = fabric_signs(node, self.settings.escalation, self._checks)
                seen_at = self._faulty_since.get((cluster, node.name), now)
                faulty.append(FaultyNode(node=node.name, place=place, fabric=signs, seen_at=seen_at))
        found = escalations(faulty, tally(places), self.settings.escalation, known=self._domains[cluster])
        return found[0] if found else None

    async def _start_rack(self, cluster: str, whole: Escalation, outcome: Callable[..., FaultOutcome]) -> FaultOutcome:
        """One RackRemediation for the domain; a start that finds it running is `already-running`."""
        settings, rack = self.settings, self.settings.escalation.rack
        known = {n: settings.bmcs[n] for n, held in self.book[cluster].items()
                 if n in settings.bmcs and rack_key(self._place(held)) == whole.rack}  # fmt: skip
        inp = RackRemediationInput(
            cluster=cluster, domain=whole.rack, reason=whole.reason, topology=settings.escalation.topology,
            breaker=settings.remediation.breaker, node_remediation=settings.remediation,
            **{**settings.escalation.rack_for(whole.rack), "bmcs": {**known, **rack.bmcs},
               "netbox": rack.netbox or settings.remediation.netbox})  # fmt: skip
        try:
            await self._client.start_workflow(
                RACK_WORKFLOW, inp, id=inp.workflow_id(), task_queue=self._task_queue,
                # A finished rack run may run again; a running one is never started twice.
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE, priority=priorities.remediation(cluster),
                search_attributes=TypedSearchAttributes(inp.search_attributes()),
                static_summary=f"remediate domain {whole.rack} whole: {whole.reason}"[:200])  # fmt: skip
        except WorkflowAlreadyStartedError:
            return outcome("already-running", f"{inp.workflow_id()} already remediates its domain", inp.workflow_id())
        except RPCError as err:
            return outcome("error", f"starting the rack remediation: {err}", inp.workflow_id())
        return outcome("escalated", f"started {inp.workflow_id()}: {whole.reason}", inp.workflow_id())

    async def _running(self, workflow_id: str) -> bool:
        try:
            described = await self._client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return described.status == WorkflowExecutionStatus.RUNNING

    def _bmc_source(self, bmc: BmcRef | None) -> str:
        if bmc is not None:
            return f"{bmc} (the settings' bmcs)"
        if self.settings.remediation.netbox:
            return "from NetBox, looked up at the remediation's start"
        return "none known (not in the settings' bmcs; remediation.netbox is off): no power-cycle"

    async def _read(self, cluster: str, name: str) -> NodeHealth | None:
        """The node as it is now (the decision is made from fresh facts, as NodeRemediation's start re-check)."""
        core = await self._connector.core(cluster)
        raw = await read_json(f"reading node {name}", core.read_node_without_preload_content(
            name, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        return node_health(raw, self.condition_types, self.label_keys) if raw is not None else None

    async def _breaker(self, cluster: str) -> str | None:
        """Why the cluster's circuit breaker forbids remediating (tripped, or unreadable: fail closed), as the
        sweep asks it; None when closed or the cluster's budget does not run yet."""
        query = WorkflowQuery(workflow_id=leases.budget_workflow_id(cluster), query=BREAKER_QUERY)
        try:
            raw = await asyncio.wait_for(query_running(self._client, query), BREAKER_TIMEOUT)
        except Exception as err:
            return f"the circuit breaker of {cluster} could not be read ({err!r}): no remediation, to be safe"
        view = BreakerView.model_validate(raw) if raw is not None else None
        return view.line() if view is not None and view.tripped else None

    def _record(self, outcome: FaultOutcome) -> FaultOutcome:
        self.counts[outcome.status] += 1
        self.recent.append(outcome)
        level = (
            logging.INFO
            if outcome.status in ("started", "flapped", "already-running", "escalated")
            else logging.WARNING
        )
        log.log(level, "fault on %s/%s (%s): %s%s%s", outcome.cluster, outcome.node, outcome.source, outcome.status,
                f": {outcome.detail}" if outcome.detail else "", f"; BMC: {outcome.bmc}" if outcome.bmc else "")  # fmt: skip
        return outcome

    async def close(self) -> None:
        for task in list(self._held.values()):
            task.cancel()
        await asyncio.gather(*self._held.values(), return_exceptions=True)
        self._held.clear()


def _reason(source: str, problems: list[str]) -> str:
    """The remediation's reason: an alert's problem names the alert already; the watch's is said to be its."""
    text = "; ".join(problems)
    return (text if source != "watch" else f"node watch: {text}")[:1024]


def _now() -> datetime:
    return datetime.now(UTC)
