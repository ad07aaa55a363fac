"""RackRemediation: one NVLink domain (an NVL72 rack) remediated as a whole (docs/remediation.md, "Whole domains").

On NVL72 the unit of failure is the domain: one GPU's NVLink going down faults every tray of its rack, and a
switch-side fault takes the domain down with no GPU counter moving (../shared/reference/topology-and-gangs.md §5).
Power-cycling such a rack node by node waits 18 turns in the budget while the rack stays broken; this workflow
(ID `rack-remediation/<cluster>/<rack>`, so a domain is never remediated twice at once) takes it whole:

  read the domain's nodes (activities/kube/racks.py `read_rack`: by rack, so a node whose clique label the fault
  took off is found) and each tray's BMC → tell the nodes' own NodeRemediations to stand down and wait (bounded)
  for them to end → lease every node at once from the cluster's budget (one group: all or none, within the
  NVLink-domain limit; the breaker judges the domain as one request) → cordon every node → drain them together (a
  gang across the domain is evicted once), reading meanwhile each tray's place in the rack (`Chassis/CBC_0`'s
  ComputeTrayIndex) → with
  `require_approval_for: [power-cycle]`, an operator's `approve` → the power sequence, one tray at a time: the
  compute trays Off in tray order, the NVLink switch trays Off, the switch trays On, the compute trays On in tray
  order (the fabric is up before the compute trays boot) → every node Ready with a new boot ID within
  `ready_timeout`, and the clique label back on every node within `fabric_timeout` → each node's own check (its
  conditions clear, and the validation gate when one is set) → the domain-wide check (one Indexed Job, a rank on
  each node, e.g. an NCCL all-reduce) → every node that passed back in service together, the leases returned.

  A domain that fails (a tray that will not power, the fabric not back, the domain check failing) stays out of
  service: every node quarantined (cordoned, tainted) with the domain's reason, for an operator. A node that fails
  alone in a domain that passed is handed, cordoned, to its own NodeRemediation (`remediation/<cluster>/<node>`),
  which goes on from there as it does for a node the sweep found. `dry_run` reads and says what would be done.

History: per node about 25 events (lease 2, cordon, drain 4+, two tray reads and power calls, the reboot wait,
health and uncordon 3 each), so 18 trays and 9 switch trays are about 600 events: far from Temporal's limits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError

from activities.entities import EntityActivities, WorkflowIds, WorkflowSignal, WorkflowSignals
from activities.kube.activities import KubeActivities
from activities.kube.models import CordonHandOver, CordonRequest, RebootWait
from activities.kube.racks import FabricState, FabricWait, RackCheckRequest, RackCheckResult, RackRead, RackView
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import DeviceLookup
from activities.node_health import NodeHealth, NodeHealthActivities, NodeHealthRequest, QuarantineRequest
from activities.redfish import BmcRef, PowerRequest, RedfishActivities
from activities.redfish_trays import TrayPlace
from workflows.budget import leases
from workflows.common import priorities
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress
from workflows.common.call_options import API_CALL, API_RETRY, BMC_CALL, NETBOX_CALL
from workflows.common.endpoints import Endpoints, EndpointWait, bmc_endpoint, kubernetes_api, with_waits
from workflows.common.errors import error_text
from workflows.common.patches import decide_early
from workflows.maintenance.drain import Drain
from workflows.maintenance.gang_drains import GangDrains
from workflows.remediation.models import NodeRemediationInput, device_facts
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.policy import HealthChecks, node_problems, remediation_workflow_id
from workflows.remediation.rack_models import (
    STAND_DOWN_SIGNAL,
    STAND_DOWN_TIMEOUT,
    RackApproval,
    RackNodeState,
    RackOutcome,
    RackRemediationInput,
    RackRemediationResult,
    RackRemediationStatus,
    RackStep,
    StandDown,
)
from workflows.validation.defaults import validation_for
from workflows.validation.gate import validate_node

VALIDATION_DEFAULT_PATCH = "rack-remediation-validation-default"  # as NodeRemediation's: the cluster's default
STAND_DOWN_POLL = timedelta(seconds=5)
HEARTBEAT = timedelta(seconds=30)
FINISHED = ("healthy", "partly-healthy", "held-out", "failed", "refused", "skipped", "dry-run")


class _DomainFailed(Exception):
    """The domain as a whole did not come back: it stays out of service."""


@workflow.defn
class RackRemediation:
    @workflow.init
    def __init__(self, inp: RackRemediationInput) -> None:
        self._inp = inp
        self._status = RackRemediationStatus()
        self._phases = Phases(finished=FINISHED)
        self._calls = Endpoints(inp.retry_timeout, shown=self._waiting, priority=priorities.remediation(inp.cluster))
        self._decisions: dict[RackStep, tuple[Literal["approve", "reject"], RackApproval]] = {}
        self._owner = ""
        self._leased: list[str] = []
        self._checks = HealthChecks(host_agent=False, bmc=False)  # the node object's part: the gate checks the GPUs
        self._validation = inp.validation  # or the cluster's default, read before any node is touched

    # ------------------------------------------------------------ queries and updates

    @workflow.query(description="Phase, every node's state (tray, verdict, drain), the power order, the checks.")
    def status(self) -> RackRemediationStatus:
        return self._status

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.update(description="Approve the step that waits for an operator (the rack's power cycle).")
    async def approve(self, req: RackApproval) -> RackRemediationStatus:
        return self._decide("approve", req)

    @approve.validator
    def _validate_approve(self, req: RackApproval) -> None:
        self._check_awaiting(req)

    @workflow.update(description="Reject the step that waits for an operator: the domain stays out of service.")
    async def reject(self, req: RackApproval) -> RackRemediationStatus:
        return self._decide("reject", req)

    @reject.validator
    def _validate_reject(self, req: RackApproval) -> None:
        self._check_awaiting(req)

    def _check_awaiting(self, req: RackApproval) -> None:
        if self._status.awaiting_approval is None:
            raise ValueError(f"no step is waiting for approval (phase {self._status.phase})")
        if req.step is not None and req.step != "power-cycle":
            raise ValueError(f"step {req.step} is not waiting for approval; power-cycle is")

    def _decide(self, decision: Literal["approve", "reject"], req: RackApproval) -> RackRemediationStatus:
        if self._status.awaiting_approval is not None:
            self._decisions.setdefault("power-cycle", (decision, req))
        return self._status

    # ------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: RackRemediationInput) -> RackRemediationResult:
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster)])
        self._owner = workflow.info().workflow_id
        decide_early(leases.SIGNAL_PATCH)  # acquire_leases asks it after local activities
        result = RackRemediationResult(cluster=inp.cluster, rack=inp.domain, outcome="healthy", reason=inp.reason)
        self._enter("reading", f"the nodes of {inp.domain}")
        view: RackView = await self._calls.execute(
            KubeActivities.read_rack, RackRead(cluster=inp.cluster, domain=inp.domain, topology=inp.topology),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"read the nodes of {inp.domain}")  # fmt: skip
        self._status.rack, self._status.domain = view.rack, view.domain
        result.rack, result.domain = view.rack, view.domain
        bmcs = await self._bmcs(view.names)
        unknown = [n for n in view.names if n not in bmcs]
        if unknown:
            return self._finish(result, "refused", f"no BMC known for {', '.join(unknown)}: the rack cannot be "
                                "power-cycled (give them in `bmcs`, or set `netbox`)")  # fmt: skip
        self._status.nodes = [RackNodeState(node=n) for n in view.names]
        result.nodes = names = view.names
        self._validation = await validation_for(inp.cluster, inp.validation, VALIDATION_DEFAULT_PATCH)
        if inp.dry_run:
            return self._finish(result, "dry-run", self._plan(view, await self._tray_order(bmcs, result)))
        await self._stand_down(names)
        if inp.disruption_budget and not await self._lease(names, result):
            return result
        try:
            return await self._remediate(view, names, bmcs, result)
        except _DomainFailed as failed:
            return await self._hold_out(result, str(failed))
        except ApplicationError as err:
            if err.type != "EndpointUnavailable":
                raise
            return await self._hold_out(result, f"gave up: {err.message}")

    def _plan(self, view: RackView, names: list[str]) -> str:
        switch = f", then {len(self._inp.switch_bmcs)} switch trays off and on" if self._inp.switch_bmcs else ""
        down = [m.place.node for m in view.nodes if not m.ready]
        return (f"would lease, cordon and drain {len(names)} nodes of rack {view.rack} (domain {view.domain or '-'}; "
                f"{len(down)} NotReady), power the compute trays off in tray order{switch}, then the compute trays "
                f"on, wait for Ready and the fabric, check each node and the domain, and return them together")  # fmt: skip

    async def _bmcs(self, names: list[str]) -> dict[str, BmcRef]:
        """Each tray's BMC: the input's, else (netbox: true) its NetBox device's."""
        inp = self._inp
        bmcs = {n: inp.bmcs[n] for n in names if n in inp.bmcs}
        if inp.netbox:
            for node in (n for n in names if n not in bmcs):
                found = await self._calls.execute(NetBoxActivities.find_device, DeviceLookup(name=node), **NETBOX_CALL,
                                                  summary=f"NetBox: {node}")  # fmt: skip
                bmc = device_facts(found.device).bmc if found.device is not None else None
                if bmc is not None:
                    bmcs[node] = bmc
        return bmcs

    async def _tray_order(self, bmcs: dict[str, BmcRef], result: RackRemediationResult) -> list[str]:
        """The nodes in tray order (ComputeTrayIndex; a tray without one after, by name), shown in the status."""
        trays = await self._trays(bmcs)
        names = sorted(bmcs, key=lambda n: (trays[n].index is None, trays[n].index or 0, n))
        for n in names:
            self._node(n).tray = trays[n].index
        self._status.nodes.sort(key=lambda state: names.index(state.node))
        self._status.power_order = [*names, *(f"switch tray {i}" for i in range(len(self._inp.switch_bmcs)))]
        result.nodes = names
        self._details()
        return names

    async def _trays(self, bmcs: dict[str, BmcRef]) -> dict[str, TrayPlace]:
        async def tray(node: str) -> TrayPlace:
            bmc = bmcs[node]
            return await self._calls.execute(RedfishActivities.redfish_tray, bmc, **BMC_CALL, endpoint=bmc_endpoint(bmc),
                                             summary=f"{node}: its tray's place")  # fmt: skip

        nodes = sorted(bmcs)
        return dict(zip(nodes, await asyncio.gather(*(tray(n) for n in nodes))))

    async def _stand_down(self, names: list[str]) -> None:
        """Tell the nodes' own remediations the domain is taken whole, and wait (bounded) until none runs."""
        runs = [remediation_workflow_id(self._inp.cluster, n) for n in names]
        payload = StandDown(by=self._owner, reason=f"rack {self._status.rack} is remediated whole").model_dump()
        gone = set(await workflow.execute_local_activity_method(
            EntityActivities.signal_workflows, WorkflowSignals(signals=[
                WorkflowSignal(workflow_id=r, signal=STAND_DOWN_SIGNAL, payload=payload) for r in runs]),
            start_to_close_timeout=timedelta(seconds=30), summary="tell the nodes' remediations to stand down"))  # fmt: skip
        running = [r for r in runs if r not in gone]
        deadline = workflow.now() + STAND_DOWN_TIMEOUT
        while running and workflow.now() < deadline:
            self._enter("waiting-for-node-runs", f"{len(running)} NodeRemediations of the domain to stand down")
            closed = await workflow.execute_activity_method(
                EntityActivities.closed_workflows, WorkflowIds(ids=running), **API_CALL,
                summary=f"{len(running)} NodeRemediations still running?")  # fmt: skip
            running = [r for r in running if r not in closed]
            if running:
                await workflow.sleep(STAND_DOWN_POLL, summary="let the nodes' remediations stand down")
        if running:
            self._status.note = f"{len(running)} NodeRemediations still ran after {STAND_DOWN_TIMEOUT}; went on"

    async def _lease(self, names: list[str], result: RackRemediationResult) -> bool:
        inp = self._inp

        def waiting(lease: Any) -> None:
            self._status.note = f"waiting for the budget: {lease.note}"  # why it waits, in its status too
            self._enter("waiting-for-budget", f"all {len(names)} nodes at once: {lease.note}")

        self._enter("waiting-for-budget", f"a lease on all {len(names)} nodes of {self._status.rack} at once")
        granted = await leases.acquire_leases(inp.cluster, names, group=self._owner, reason=f"rack remediation: "
                                              f"{inp.reason}", budget=inp.budget, remediation=inp.breaker,
                                              waiting=waiting)  # fmt: skip
        refused = [lease for lease in granted if lease.state == "refused"]
        if refused:
            self._finish(result, "refused", refused[0].note)
            return False
        self._leased = list(names)
        self._status.lease, self._status.note = True, ""
        return True

    async def _remediate(self, view: RackView, names: list[str], bmcs: dict[str, BmcRef],
                         result: RackRemediationResult) -> RackRemediationResult:  # fmt: skip
        inp = self._inp
        self._enter("cordoning", f"{len(names)} nodes")
        await self._each(names, self._cordon)
        self._enter("draining", f"{len(names)} nodes together")
        # Where each tray sits is read beside the drains: it orders the power sequence only, and the domain goes out
        # of service without waiting for 18 BMCs.
        names, _ = await asyncio.gather(self._tray_order(bmcs, result), self._drain(names))
        if "power-cycle" in inp.require_approval_for:
            decision, who = await self._approval()
            if decision == "reject":
                raise _DomainFailed(f"power cycle rejected by {who}")
        boots = {m.place.node: m.boot_id for m in view.nodes}
        await self._power_sequence(names, bmcs, result)
        self._enter("waiting-for-nodes", f"{len(names)} nodes Ready with a new boot ID")
        back = await self._each(names, lambda n: self._rebooted(n, boots[n]))
        late = [n for n, ok in zip(names, back) if not ok]
        if len(late) == len(names):
            raise _DomainFailed(f"no node came back Ready within {inp.ready_timeout}")
        up = [n for n in names if n not in late]
        self._enter("waiting-for-fabric", f"the clique label on {len(up)} nodes")
        racks = {m.place.rack for m in view.nodes}
        rack = racks.pop() if len(racks) == 1 else None  # one rack: only its nodes are read at each look
        fabric: FabricState = await self._calls.execute(
            KubeActivities.wait_fabric, FabricWait(cluster=inp.cluster, nodes=up, topology=inp.topology, rack=rack,
                                                   timeout_seconds=inp.fabric_timeout.total_seconds()),
            start_to_close_timeout=inp.fabric_timeout + timedelta(minutes=1), heartbeat_timeout=HEARTBEAT,
            retry_policy=API_RETRY, endpoint=kubernetes_api(inp.cluster), summary="wait for the NVLink fabric")  # fmt: skip
        if not fabric.complete:
            why = (f"the clique label did not come back on {', '.join(fabric.missing[:6])}" if fabric.missing
                   else f"the nodes show {len(fabric.domains)} NVLink domains: {', '.join(fabric.domains)}")  # fmt: skip
            raise _DomainFailed(f"NVLink fabric not whole after {inp.fabric_timeout}: {why}")
        self._enter("checking", f"{len(up)} nodes")
        alone = dict(zip(up, await self._each(up, self._node_check)))
        failed = {n: why for n, why in alone.items() if why} | {n: "not Ready with a new boot ID" for n in late}
        passed = [n for n in names if n not in failed]
        if not passed:
            raise _DomainFailed("every node failed its own check")
        if inp.domain_check is not None:
            self._enter("checking-domain", f"a rank on each of {len(passed)} nodes")
            gpus = min((m.gpus for m in view.nodes if m.place.node in passed and m.gpus), default=0)
            check: RackCheckResult = await self._calls.execute(
                KubeActivities.run_rack_check, RackCheckRequest(**inp.domain_check.model_dump(), cluster=inp.cluster,
                                                                rack=self._status.rack, nodes=passed, gpus=gpus,
                                                                run=self._owner),
                start_to_close_timeout=inp.domain_check.timeout + timedelta(minutes=2), heartbeat_timeout=HEARTBEAT,
                retry_policy=API_RETRY, endpoint=kubernetes_api(inp.cluster), summary="the domain-wide check")  # fmt: skip
            self._status.domain_check = result.domain_check = (f"{'passed' if check.passed else 'failed'} "
                                                               f"(Job {check.job}): {check.message}")  # fmt: skip
            if not check.passed:
                raise _DomainFailed(f"the domain-wide check failed: {check.message}")
        for node, why in failed.items():
            self._node(node).verdict, self._node(node).detail = "failed-alone", why
        return await self._return(result, passed, failed)

    # ------------------------------------------------------------ steps

    async def _each(self, nodes: list[str], step: Callable[[str], Awaitable[Any]]) -> list[Any]:
        return list(await asyncio.gather(*(step(n) for n in nodes)))

    async def _cordon(self, node: str) -> None:
        inp = self._inp
        held = await self._calls.execute(
            KubeActivities.cordon_node, CordonRequest(cluster=inp.cluster, node=node, owner=self._owner,
                                                      reason=f"rack remediation: {inp.reason}"),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"cordon {node}")  # fmt: skip
        state = self._node(node)
        state.cordoned_by_us = held.owned
        if not held.owned:  # powered with its rack all the same; its holder decides when it returns
            state.verdict, state.detail = "not-ours", f"cordoned by {held.holder}: left to them"
        self._details()

    async def _drain(self, names: list[str]) -> None:
        """Every node's drain at once: a gang with pods on several nodes of the domain is evicted together, once."""
        inp = self._inp
        together = GangDrains(names, asyncio.Semaphore(len(names)), self._no_window)
        for n in names:
            together.cordoned(n)

        async def drain(node: str) -> None:
            try:
                await Drain(inp.cluster, node, inp.drain, self._node(node), priority=priorities.remediation(inp.cluster),
                            stopping=lambda: False, changed=self._details, together=together).run()  # fmt: skip
            except (ActivityError, ApplicationError) as err:  # the rack is powered off next: what stays is lost
                self._node(node).detail = f"drain incomplete: {error_text(err)}"

        await self._each(names, drain)

    @staticmethod
    async def _no_window() -> None:
        return None

    async def _approval(self) -> tuple[str, str]:
        inp = self._inp
        deadline = workflow.now() + inp.approval_timeout
        self._status.awaiting_approval = f"power-cycle until {deadline.isoformat()} (default {inp.default_on_timeout})"
        self._enter("awaiting-approval", f"power-cycle of rack {self._status.rack}: `approve` or `reject`")
        try:
            await workflow.wait_condition(lambda: "power-cycle" in self._decisions, timeout=inp.approval_timeout,
                                          timeout_summary="approval of the rack's power cycle")  # fmt: skip
            decision, req = self._decisions["power-cycle"]
            return decision, req.by + (f": {req.comment}" if req.comment else "")
        except TimeoutError:
            return inp.default_on_timeout, f"default on timeout ({inp.approval_timeout})"
        finally:
            self._status.awaiting_approval = None

    async def _power_sequence(self, names: list[str], bmcs: dict[str, BmcRef], result: RackRemediationResult) -> None:
        """Compute trays off (tray order), switch trays off, switch trays on, compute trays on (tray order): one tray
        at a time, each state read back from its BMC before the next."""
        switches = list(self._inp.switch_bmcs)
        self._enter("powering-off", f"{len(names)} compute trays, then {len(switches)} switch trays")
        for node in names:
            await self._power(node, bmcs[node], "Off")
        for i, bmc in enumerate(switches):
            await self._power(f"switch tray {i}", bmc, "Off")
        self._enter("powering-on", f"{len(switches)} switch trays, then {len(names)} compute trays")
        for i, bmc in enumerate(switches):
            await self._power(f"switch tray {i}", bmc, "On")
        for node in names:
            await self._power(node, bmcs[node], "On")
        result.power_cycles = len(names) + len(switches)

    async def _power(self, tray: str, bmc: BmcRef, state: Literal["On", "Off"]) -> None:
        try:
            await self._calls.execute(
                RedfishActivities.redfish_power, PowerRequest(bmc=bmc, state=state,
                                                              timeout_seconds=self._inp.power_timeout.total_seconds()),
                **{**BMC_CALL, "start_to_close_timeout": self._inp.power_timeout + timedelta(minutes=1)},
                heartbeat_timeout=HEARTBEAT, endpoint=bmc_endpoint(bmc), summary=f"{tray}: power {state.lower()}")  # fmt: skip
        except ActivityError as err:
            raise _DomainFailed(f"{tray} did not power {state.lower()}: {error_text(err)}") from None
        if not tray.startswith("switch"):
            self._node(tray).powered.append(state)
        self._details()

    async def _rebooted(self, node: str, boot_id: str) -> bool:
        inp = self._inp
        try:
            await self._calls.execute(
                KubeActivities.wait_node_rebooted, RebootWait(cluster=inp.cluster, node=node, previous_boot_id=boot_id,
                                                              timeout_seconds=inp.ready_timeout.total_seconds()),
                start_to_close_timeout=inp.ready_timeout + timedelta(minutes=1), heartbeat_timeout=HEARTBEAT,
                retry_policy=API_RETRY, endpoint=kubernetes_api(inp.cluster), summary=f"wait for {node} to come back")  # fmt: skip
        except ActivityError as err:
            self._node(node).detail = f"not back: {error_text(err)}"
            return False
        return True

    async def _node_check(self, node: str) -> str:
        """Why the node fails on its own ('' when it passes): its conditions, then the validation gate if set."""
        inp = self._inp
        health: NodeHealth = await self._calls.execute(
            NodeHealthActivities.read_node_health,
            NodeHealthRequest(cluster=inp.cluster, node=node, condition_types=self._checks.condition_types(),
                              label_keys=self._checks.label_keys()),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"read {node}'s health")  # fmt: skip
        problems, _ = node_problems(health, self._checks, health.decided_at(workflow.now()))
        if problems:
            return "; ".join(problems)
        validation = self._validation
        if validation is not None and validation.enabled:
            verdict = await validate_node(inp.cluster, node, validation, by=self._owner)
            if not verdict.passed:
                return f"validation failed: {verdict.reason}"
        return ""

    # ------------------------------------------------------------ the end

    async def _return(self, result: RackRemediationResult, passed: list[str],
                      failed: dict[str, str]) -> RackRemediationResult:  # fmt: skip
        """Every node that passed back in service together; each that failed alone to its own NodeRemediation."""
        inp = self._inp
        ours = [n for n in passed if self._node(n).cordoned_by_us]
        self._enter("returning", f"{len(ours)} nodes together")

        async def uncordon(node: str) -> None:
            await self._calls.execute(
                KubeActivities.uncordon_node, CordonRequest(cluster=inp.cluster, node=node, owner=self._owner,
                                                            reason=f"rack remediation: {inp.reason}"),
                **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"uncordon {node}")  # fmt: skip
            self._node(node).verdict = "returned"

        await self._each(ours, uncordon)
        result.returned = ours
        for node, why in failed.items():
            if await self._hand_to_node_remediation(node, why):
                result.handed_to_node_remediation.append(node)
        await self._release("remediated whole")
        outcome: RackOutcome = "partly-healthy" if failed else "healthy"
        note = f"{len(ours)} nodes back in service together" + (
            f"; {len(failed)} failed alone, handed to their NodeRemediation: {', '.join(sorted(failed))}"
            if failed
            else ""
        )
        return self._finish(result, outcome, note)

    async def _hand_to_node_remediation(self, node: str, why: str) -> bool:
        inp = self._inp
        if not self._node(node).cordoned_by_us:
            return False
        run = remediation_workflow_id(inp.cluster, node)
        passed = await self._calls.execute(
            KubeActivities.hand_over_cordon, CordonHandOver(cluster=inp.cluster, node=node, owner=self._owner, to=run,
                                                            reason=f"failed alone after its rack's remediation: {why}"),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"hand {node} over to its NodeRemediation")  # fmt: skip
        if not passed.owned:
            return False
        child = NodeRemediationInput(cluster=inp.cluster, node=node, reason=f"failed alone after rack "
                                     f"{self._status.rack}'s remediation: {why}"[:1024], bmc=inp.bmcs.get(node),
                                     requested_by=self._owner, **inp.node_remediation.model_dump())  # fmt: skip
        with contextlib.suppress(WorkflowAlreadyStartedError):  # its own run holds it already
            await workflow.start_child_workflow(
                NodeRemediation.run, child, id=run, task_queue=workflow.info().task_queue,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON, priority=priorities.remediation(inp.cluster),
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                search_attributes=TypedSearchAttributes(child.search_attributes()),
                static_summary=f"remediate {node}: {child.reason}"[:200])  # fmt: skip
        self._node(node).verdict = "failed-alone"
        return True

    async def _hold_out(self, result: RackRemediationResult, why: str) -> RackRemediationResult:
        """The domain failed: every node of ours stays cordoned, quarantined with the domain's reason."""
        inp = self._inp
        reason = f"rack {self._status.rack} (domain {self._status.domain or '-'}): {why}"[:1024]
        ours = [n.node for n in self._status.nodes if n.cordoned_by_us]
        self._enter("holding-out", reason)

        async def quarantine(node: str) -> None:
            await self._calls.execute(
                NodeHealthActivities.quarantine_node, QuarantineRequest(cluster=inp.cluster, node=node, owner=self._owner,
                                                                        reason=reason),
                **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"quarantine {node}")  # fmt: skip
            self._node(node).verdict = "held-out"

        await self._each(ours, quarantine)
        result.held_out = ours
        await self._release("the domain is held out; its nodes stay cordoned")
        return self._finish(result, "held-out", reason)

    async def _release(self, reason: str) -> None:
        if self._leased:
            await leases.release_leases(self._inp.cluster, self._leased, reason=reason)
            self._leased = []
            self._status.lease = False

    # ------------------------------------------------------------ visibility

    def _node(self, name: str) -> RackNodeState:
        return self._status.node(name)

    def _enter(self, phase: str, details: str = "") -> None:
        self._status.phase = phase
        self._phases.enter(phase, details)
        self._details()

    def _waiting(self, waits: list[EndpointWait]) -> None:
        self._phases.progress.waiting = waits
        self._details()

    def _details(self) -> None:
        s, inp = self._status, self._inp
        lines = [f"**{s.phase}** rack `{s.rack or inp.domain}` in `{inp.cluster}` (domain {s.domain or '-'}): "
                 f"{inp.reason}"]  # fmt: skip
        if s.awaiting_approval:
            lines.append(f"waiting for `approve`/`reject` of {s.awaiting_approval}")
        counts: dict[str, int] = {}
        for n in s.nodes:
            counts[n.verdict] = counts.get(n.verdict, 0) + 1
        if counts:
            lines.append(", ".join(f"{v}: {c}" for v, c in sorted(counts.items())))
        if s.domain_check:
            lines.append(f"domain check {s.domain_check}")
        if s.note:
            lines.append(s.note)
        self._phases.progress.details = lines[0]
        workflow.set_current_details(with_waits("\n\n".join(lines), self._phases.progress.waiting))

    def _finish(self, result: RackRemediationResult, outcome: RackOutcome, note: str) -> RackRemediationResult:
        result.outcome = outcome
        for n in self._status.nodes:
            result.add(n)
        result.note = "; ".join(t for t in (note, self._status.note) if t)
        self._status.note = result.note
        self._enter(outcome, note)
        return result
