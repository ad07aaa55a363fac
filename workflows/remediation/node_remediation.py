"""Remediation of unhealthy nodes: `NodeRemediation` (one node, a ladder of fixes); `FleetHealthSweep`
(workflows/remediation/health_sweep.py) finds the unhealthy nodes and starts one each.

NodeRemediation, for one node (workflow ID `remediation/<cluster>/<node>`, so a node is never remediated
twice at once):

  lease from the cluster's disruption budget → cordon (ownership on the node) → drain (the drain node
  maintenance uses) → for each step of the ladder (`restart-gpu-services`, `reset-gpu` through the node's host
  agent; `power-cycle` through Redfish, Off then On, waiting for Ready with a new boot ID), optionally after an
  operator's approval: its success check (node conditions clear, the host agent's GPU check clean, the BMC's
  health rollup not critical, within `settle_timeout`), then a short burn-in (GPU check, stress, GPU check,
  `gpu_verdict`), and with `validation` the validation gate (workflows/validation/gate.py) → healthy: uncordon,
  return the lease.

  At its start it reads the node and ends `skipped`, touching nothing, when the node is quarantined, opted out,
  remediated less than `cooldown` ago, or written by Millwright since the sweep decided from it (`decided_from`):
  the policy's `start_refusal`, the rule the sweep decides by. An operator's explicit request (`requested_by`)
  goes ahead.
  A run that waited in the budget's queue for a fault its node object showed re-checks the node once the lease is
  granted (the success check without burn-in), and ends `healthy`, returning the lease, when it recovered meanwhile.

  A remediation's lease counts towards the cluster's circuit breaker (workflows/budget/breaker.py): while it
  is tripped (or when this node would trip it) the lease is refused and the run ends `refused`, touching nothing;
  a run handed its node cordoned waits for a reset instead (workflows/remediation/breaker_wait.py).
  When it ends (healthy, quarantined, failed) it annotates the node `millwright.dev/last-remediation` (when, by
  whom, how), which the sweep's per-node cooldown reads.

  Told to stand down by a RackRemediation of the node's domain (the `stand_down` signal), it ends `stood-down`:
  untouched before its cordon, else at its next step boundary with its cordon handed over (stand_down.py).

  Ladder exhausted: quarantine — the node stays cordoned, with the reason in an annotation and a
  `millwright.dev/quarantine=true:NoSchedule` taint; NetBox `failed` with a journal entry and the
  `millwright-quarantine` tag; the lease is returned (the quarantined node, cordoned and tainted, still counts
  against the budget as a node out of service); a webhook notification.

The models are in workflows/remediation/models.py, the decisions in its policy, the outcome's records (NetBox,
the node's mark, the webhook) in workflows/remediation/records.py.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout

from activities.gpu.activities import HostAgentActivities
from activities.gpu.models import (
    EmptyRequest,
    GpuCheckRequest,
    GpuCheckResult,
    GpuResetRequest,
    StressRequest,
    StressResult,
    host_task_queue,
)
from activities.gpu.verdict import gpu_verdict
from activities.kube.activities import KubeActivities
from activities.kube.models import CordonRequest, NodeRef, RebootWait
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import DeviceLookup
from activities.node_health import (
    NodeHealth,
    NodeHealthActivities,
    NodeHealthRequest,
    QuarantineRequest,
)
from activities.redfish import BmcRef, PowerRequest, RedfishActivities, RedfishHealth
from workflows.budget import leases
from workflows.common import priorities
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress
from workflows.common.call_options import AGENT_RETRY, API_CALL, API_RETRY, BMC_CALL, NETBOX_CALL
from workflows.common.endpoints import Endpoints, EndpointWait, bmc_endpoint, kubernetes_api, with_waits
from workflows.common.errors import error_text
from workflows.common.patches import decide_early
from workflows.maintenance.drain import Drain
from workflows.remediation import breaker_wait, settle
from workflows.remediation.approvals import Approvals, Rejected
from workflows.remediation.models import (
    Approval,
    NodeRemediationInput,
    NodeRemediationResult,
    NodeRemediationStatus,
    Outcome,
    Step,
    StepRecord,
    device_facts,
    finding_text,
)
from workflows.remediation.policy import BmcObservation, bmc_problems, node_problems, start_refusal
from workflows.remediation.rack_models import STAND_DOWN_SIGNAL, StandDown
from workflows.remediation.records import MARK_REMEDIATED_PATCH, OutcomeRecords
from workflows.remediation.stand_down import StandDownOrder, StoodDown
from workflows.validation.defaults import validation_for
from workflows.validation.gate import validate_node

# BMC, NetBox and host-agent calls are made as burn-in makes them (workflows.burnin.server_burnin: BMC_CALL, NETBOX_CALL,
# AGENT_RETRY); every call to an endpoint is bounded by retry_timeout, a webhook's by notify_timeout
# (workflows/remediation/records.py), and the outcome is recorded before the webhook is notified
# (NOTIFY_AFTER_OUTCOME_PATCH).
NOTIFY_AFTER_OUTCOME_PATCH = "remediation-notify-after-outcome"
FRESH_FACTS_PATCH = "remediation-fresh-facts"  # the node re-read at the start refuses a stale or unwanted run
VALIDATION_PATCH = "remediation-validation"  # the validation gate after a step's own success check
VALIDATION_DEFAULT_PATCH = "remediation-validation-default"  # the cluster's default when the input has none
RECHECK_AFTER_LEASE_PATCH = "remediation-recheck-after-lease"  # a node that recovered in the queue is left alone
HEARTBEAT = timedelta(seconds=30)


# ---------------------------------------------------------------- NodeRemediation


@workflow.defn
class NodeRemediation:
    @workflow.init
    def __init__(self, inp: NodeRemediationInput) -> None:
        self._inp = inp
        self._status = NodeRemediationStatus()
        self._phases = Phases(finished=("healthy", "quarantined", "failed", "skipped", "refused", "left-cordoned",
                                        "stood-down"))  # fmt: skip
        self._calls = Endpoints(inp.retry_timeout, shown=self._waiting, priority=priorities.remediation(inp.cluster))
        self._lease: Any = None
        self._rma: list[str] = []  # findings whose remedy is an RMA: no step of the ladder fixes them
        self._records = OutcomeRecords(inp, self._calls, self._status, self._details)
        self._validation = inp.validation  # or the cluster's default, read before the node is touched
        self._approvals = Approvals(inp, self._status, self._enter)
        self._stand_down = StandDownOrder()  # workflows/remediation/stand_down.py

    # ------------------------------------------------------------ queries and updates

    @workflow.query(description="Phase, ladder steps done with their outcomes, approval awaited, drain progress.")
    def status(self) -> NodeRemediationStatus:
        return self._status

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.update(description="Approve the step that waits for an operator (e.g. the power cycle).")
    async def approve(self, req: Approval) -> NodeRemediationStatus:
        return self._approvals.decide("approve", req)

    @approve.validator
    def _validate_approve(self, req: Approval) -> None:
        self._approvals.check(req)

    @workflow.update(description="Reject the step that waits for an operator: the ladder goes on without it.")
    async def reject(self, req: Approval) -> NodeRemediationStatus:
        return self._approvals.decide("reject", req)

    @reject.validator
    def _validate_reject(self, req: Approval) -> None:
        self._approvals.check(req)

    @workflow.signal(name=STAND_DOWN_SIGNAL, description="A RackRemediation takes the node's whole domain over: "
                     "end untouched, or after the current step with the cordon handed to it.")  # fmt: skip
    def stand_down(self, order: StandDown) -> None:
        self._stand_down.receive(order)

    # ------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: NodeRemediationInput) -> NodeRemediationResult:
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster), sa.NODE.value_set(inp.node)])
        self._stand_down.decide()
        self._phases.progress.total = len(inp.steps)
        result = NodeRemediationResult(cluster=inp.cluster, node=inp.node, outcome="healthy", reason=inp.reason)
        owner = workflow.info().workflow_id
        cordon = CordonRequest(cluster=inp.cluster, node=inp.node, owner=owner, reason=f"remediation: {inp.reason}")
        self._enter("starting", inp.reason)
        bmc, gpus, model = await self._inventory(inp)
        health = await self._health()
        if workflow.patched(FRESH_FACTS_PATCH):
            # The facts the run was started on may be old (a sweep's decision delayed past another run's end).
            refusal = start_refusal(
                health, health.decided_at(workflow.now()), inp.cooldown, inp.decided_from, inp.requested_by
            )
            if refusal is not None:
                return self._finish(result, "skipped", f"left alone: {refusal}")
            if inp.requested_by is not None:
                self._status.note = f"requested by {inp.requested_by}"
        # A node quarantined earlier and remediated again (an operator's request): fixed, its quarantine is lifted.
        quarantined = health.quarantined
        faulty = bool(self._faults(health))  # a fault the node object shows, which a wait for the lease may outlast
        # The lease is asked for right after the default's local activity, the outcome marked right after the
        # validation gate's or a returned lease's: their patches are decided here.
        handed = breaker_wait.handed_over(health, owner)  # its cordon was passed to it: no other run holds the node
        decide_early(leases.SIGNAL_PATCH, MARK_REMEDIATED_PATCH, NOTIFY_AFTER_OUTCOME_PATCH, RECHECK_AFTER_LEASE_PATCH,
                     *[breaker_wait.PATCH, breaker_wait.DEADLINE_PATCH] * handed)  # fmt: skip
        self._validation = await validation_for(inp.cluster, inp.validation, VALIDATION_DEFAULT_PATCH)
        check = GpuCheckRequest(expected_count=gpus, expected_model=model, report_unavailable=True)

        if inp.disruption_budget:
            queued = False

            def waiting(lease: Any) -> None:
                nonlocal queued
                queued = True
                self._enter("waiting-for-budget", f"place {lease.position}: {lease.note}")

            self._enter("waiting-for-budget", f"a lease on cluster {inp.cluster}")
            ask = functools.partial(leases.acquire_lease, inp.cluster, inp.node, holder=owner, waiting=waiting,
                                    reason=f"remediation: {inp.reason}", budget=inp.budget, remediation=inp.breaker,
                                    cancelled=lambda: self._stand_down.given is not None)  # fmt: skip
            lease = await ask()
            if lease is not None and lease.state == "refused" and handed and workflow.patched(breaker_wait.PATCH):
                wait = breaker_wait.BreakerWait(inp, owner, self._status, self._enter)
                if (lease := await wait.wait(lease, ask)) is not None and lease.state == "refused":
                    return self._finish(result, "left-cordoned", wait.gave_up(lease))
            if lease is not None and lease.state == "refused":  # the node was never touched
                return self._finish(result, "refused", lease.note)
            self._lease = lease
            self._status.lease = lease is not None  # None: the request withdrawn, standing down
            if self._stand_down.given is not None:  # told while it waited, or as the lease came
                return await self._stood_down(result, cordon, cordoned=handed)
            # The start's read is as old as the wait: a fault the node object showed may have cleared meanwhile.
            if queued and faulty and workflow.patched(RECHECK_AFTER_LEASE_PATCH):
                self._enter("re-checking", "after the wait for a lease")
                problems, _ = await self._problems(bmc, check)
                if not problems:
                    await self._return_lease("recovered while waiting for the lease")
                    return self._finish(result, "healthy", "recovered while waiting for its lease: left alone")

        self._enter("cordoning")
        try:
            held = await self._calls.execute(
                KubeActivities.cordon_node,
                cordon,
                **API_CALL,
                endpoint=kubernetes_api(inp.cluster),
                summary=f"cordon {inp.node}",
            )
        except ApplicationError as err:
            return await self._gave_up(result, err, "the node is left as it is (the cordon may have landed)")
        self._status.cordoned_by_us = held.owned
        if not held.owned:
            await self._return_lease("cordoned by someone else")
            return self._finish(result, "skipped", f"cordoned by {held.holder}; left to them")
        try:
            return await self._remediate(inp, result, cordon, owner, bmc, check, quarantined)
        except ApplicationError as err:
            return await self._gave_up(result, err, "the node stays cordoned")

    async def _stood_down(self, result: NodeRemediationResult, cordon: CordonRequest, *,
                          cordoned: bool) -> NodeRemediationResult:  # fmt: skip
        note = await self._stand_down.hand_over(self._calls, cordon, self._status, self._enter, cordoned=cordoned)
        await self._return_lease(note)
        return self._finish(result, "stood-down", note)

    async def _gave_up(self, result: NodeRemediationResult, err: ApplicationError, left: str) -> NodeRemediationResult:
        """A call gave up on its endpoint (workflows.common.endpoints): the node is left cordoned, the failure is the
        outcome (as after a failed drain)."""
        if err.type != "EndpointUnavailable":
            raise err
        why = f"gave up: {err.message}; {left}"
        # No mark on the node: the API just gave up on us.
        return await self._conclude(result, "failed", why, event="remediation-failed", lease=f"gave up; {left}",
                                    mark=False)  # fmt: skip

    async def _remediate(self, inp: NodeRemediationInput, result: NodeRemediationResult, cordon: CordonRequest,
                         owner: str, bmc: BmcRef | None, check: GpuCheckRequest,
                         quarantined: str | None) -> NodeRemediationResult:  # fmt: skip
        """The node is cordoned by us: `_ladder`, or, told to stand down, its cordon handed over at a step boundary."""
        try:
            return await self._ladder(inp, result, cordon, owner, bmc, check, quarantined)
        except StoodDown:
            return await self._stood_down(result, cordon, cordoned=True)

    async def _ladder(self, inp: NodeRemediationInput, result: NodeRemediationResult, cordon: CordonRequest,
                      owner: str, bmc: BmcRef | None, check: GpuCheckRequest,
                      quarantined: str | None) -> NodeRemediationResult:  # fmt: skip
        """Drain, climb the ladder, and uncordon (fixed) or quarantine (exhausted)."""
        self._enter("draining")
        try:
            await Drain(inp.cluster, inp.node, inp.drain, self._status, priority=priorities.remediation(inp.cluster),
                        stopping=lambda: self._stand_down.given is not None,
                        changed=self._details).run()  # fmt: skip
        except (ActivityError, ApplicationError) as err:
            health = await self._health()
            if health.ready:  # a live node that cannot be drained must not be power cycled
                why = f"drain failed: {error_text(err)}"
                return await self._conclude(result, "failed", f"{why}; the node stays cordoned",
                                            event="remediation-failed", lease="drain failed; the node stays cordoned",
                                            lease_first=False)  # fmt: skip
            self._status.note = f"drain incomplete on a NotReady node: {error_text(err)}"

        self._stand_down.boundary()
        if inp.checks.host_agent:
            # A finding no step can fix (a row-remap failure: RMA) sends the node to quarantine at once.
            self._enter("diagnosing", "GPU check")
            try:
                self._blame(await self._agent(HostAgentActivities.host_gpu_check, check, timedelta(minutes=5),
                                              "GPU check before the ladder"))  # fmt: skip
            except (_Unavailable, ActivityError) as err:
                self._status.note = f"no GPU check before the ladder: {error_text(err)}"
        for i, step in enumerate(inp.steps):
            self._stand_down.boundary()
            if self._rma:
                break
            record = await self._try_step(step, bmc, check)
            self._status.steps.append(record)
            self._phases.progress.done = i + 1
            if record.outcome == "fixed":
                result.fixed_by = step
                if quarantined:
                    self._enter("lifting-quarantine", f"fixed by {step}")
                    await self._records.lift_quarantine(result, owner, f"fixed by {step}")
                self._enter("uncordoning", f"fixed by {step}")
                done = await self._calls.execute(
                    KubeActivities.uncordon_node,
                    cordon,
                    **API_CALL,
                    endpoint=kubernetes_api(inp.cluster),
                    summary=f"uncordon {inp.node}",
                )
                result.uncordoned = done.uncordoned
                await self._return_lease(f"fixed by {step}")
                await self._records.mark_remediated("healthy")
                return self._finish(result, "healthy", f"fixed by {step}")
        self._stand_down.boundary()
        return await self._quarantine(result, owner, bmc)

    # ------------------------------------------------------------ the ladder

    async def _try_step(self, step: Step, bmc: BmcRef | None, check: GpuCheckRequest) -> StepRecord:
        inp = self._inp
        self._status.step = step
        approval: str | None = None
        if step in inp.require_approval_for:
            try:
                approval = await self._approvals.wait(step, interrupted=lambda: self._stand_down.given is not None)
            except Rejected as rejected:
                return StepRecord(step=step, outcome="rejected", approval=str(rejected))
            self._stand_down.boundary()
        self._enter(step)
        try:
            detail = await self._act(step, bmc, check)
        except _Unavailable as err:
            return StepRecord(step=step, outcome="unavailable", detail=str(err), approval=approval)
        except (ActivityError, ApplicationError) as err:
            return StepRecord(step=step, outcome="failed", detail=error_text(err), approval=approval)
        try:
            healthy, why = await self._verify(bmc, check)
            validation = self._validation
            if healthy and validation is not None and validation.enabled and workflow.patched(VALIDATION_PATCH):
                self._enter("validating")
                verdict = await validate_node(
                    inp.cluster,
                    inp.node,
                    validation,
                    by=workflow.info().workflow_id,
                    attempt=len(self._status.steps) + 1,
                )
                if not verdict.passed:  # the ladder goes on, and ends in quarantine if nothing makes it pass
                    healthy, why = False, f"validation failed: {verdict.reason}"
        except (ActivityError, ApplicationError) as err:
            healthy, why = False, f"check failed: {error_text(err)}"
        return StepRecord(step=step, outcome="fixed" if healthy else "not-fixed",
                          detail="; ".join(d for d in (detail, why) if d), approval=approval)  # fmt: skip

    async def _act(self, step: Step, bmc: BmcRef | None, check: GpuCheckRequest) -> str:
        inp = self._inp
        if step == "restart-gpu-services":
            done = await self._agent(HostAgentActivities.host_restart_gpu_services, EmptyRequest(),
                                     timedelta(minutes=10), "restart GPU services")  # fmt: skip
            return f"restarted {', '.join(done.restarted) or 'no GPU service (none installed)'}"
        if step == "reset-gpu":
            # The GPUs the latest check blames; none blamed (or no check yet): every GPU.
            seen: GpuCheckResult = await self._agent(HostAgentActivities.host_gpu_check, check, timedelta(minutes=5),
                                                     "GPU check: which GPUs to reset")  # fmt: skip
            blamed = sorted({f.gpu for f in seen.findings if f.severity == "fail" and f.gpu is not None})
            indexes = blamed or [g.index for g in seen.snapshot.gpus]
            if not indexes:
                raise _Unavailable("no GPU to reset: NVML sees none")
            for index in indexes:
                await self._agent(HostAgentActivities.host_reset_gpu, GpuResetRequest(index=index),
                                  timedelta(minutes=10), f"reset GPU {index}")  # fmt: skip
            return f"reset GPU {', '.join(str(i) for i in indexes)}"
        if bmc is None:
            raise _Unavailable("no BMC known for this node")
        info = await self._calls.execute(
            KubeActivities.inspect_node,
            NodeRef(cluster=inp.cluster, node=inp.node),
            **API_CALL,
            endpoint=kubernetes_api(inp.cluster),
            summary="read boot ID",
        )
        for state in ("Off", "On"):
            await self._calls.execute(
                RedfishActivities.redfish_power, PowerRequest(bmc=bmc, state=state), **BMC_CALL,
                heartbeat_timeout=HEARTBEAT, endpoint=bmc_endpoint(bmc), summary=f"power {state.lower()}")  # fmt: skip
        self._enter("waiting-for-node", "Ready with a new boot ID")
        try:
            await self._calls.execute(
                KubeActivities.wait_node_rebooted,
                RebootWait(cluster=inp.cluster, node=inp.node, previous_boot_id=info.boot_id or "",
                           timeout_seconds=inp.reboot_timeout.total_seconds()),
                start_to_close_timeout=inp.reboot_timeout + timedelta(minutes=1), heartbeat_timeout=HEARTBEAT,
                retry_policy=API_RETRY, endpoint=kubernetes_api(inp.cluster),
                summary=f"wait for {inp.node} to come back")  # fmt: skip
        except ActivityError as err:
            raise ApplicationError(f"power cycled, but {error_text(err)}", type="RebootTimeout") from None
        return "power cycled"

    async def _agent(self, method: Any, arg: Any, start_to_close: timedelta, summary: str) -> Any:
        """Run a host-agent activity on the node's own queue; no agent picking it up in time: _Unavailable."""
        try:
            return await workflow.execute_activity_method(
                method, arg, task_queue=host_task_queue(self._inp.node),
                schedule_to_start_timeout=self._inp.agent_timeout, start_to_close_timeout=start_to_close,
                heartbeat_timeout=timedelta(minutes=2) if start_to_close > timedelta(minutes=2) else None,
                retry_policy=AGENT_RETRY, priority=priorities.remediation(self._inp.cluster),
                summary=summary)  # fmt: skip
        except ActivityError as err:
            if isinstance(err.cause, ActivityTimeout) and err.cause.type == TimeoutType.SCHEDULE_TO_START:
                raise _Unavailable(f"no host agent picked up '{summary}' within {self._inp.agent_timeout}") from None
            raise

    async def _verify(self, bmc: BmcRef | None, check: GpuCheckRequest) -> tuple[bool, str]:
        """The step's success check: conditions, GPU check and BMC clear within settle_timeout, then burn-in."""
        inp = self._inp
        self._enter("re-checking")
        before: GpuCheckResult | None = None

        async def look() -> list[str]:
            nonlocal before
            self._status.problems, before = await self._problems(bmc, check)
            return self._status.problems

        if problems := await settle.settled(inp, look, self._details):
            return False, "still unhealthy: " + "; ".join(problems)
        if not inp.checks.host_agent or before is None:
            return True, "checks clear (no burn-in without the host agent)"
        self._enter("burn-in", f"{inp.burn_in_seconds:.0f}s of GPU stress")
        try:
            stress: StressResult = await self._agent(
                HostAgentActivities.host_gpu_stress,
                StressRequest(seconds=inp.burn_in_seconds, dcgm_level=inp.dcgm_level),
                timedelta(seconds=inp.burn_in_seconds * 2 + 600), "GPU stress")  # fmt: skip
            after: GpuCheckResult = await self._agent(HostAgentActivities.host_gpu_check, check, timedelta(minutes=5),
                                                      "GPU check after stress")  # fmt: skip
        except _Unavailable as err:
            return False, f"burn-in: {err}"
        verdict = gpu_verdict(check, before.snapshot, after.snapshot, stress)
        failed = self._blame(verdict)
        if failed:
            self._status.problems = [finding_text(f) for f in failed]
            return False, "burn-in failed: " + "; ".join(self._status.problems)
        return True, "checks clear; burn-in passed"

    async def _problems(self, bmc: BmcRef | None, check: GpuCheckRequest) -> tuple[list[str], GpuCheckResult | None]:
        inp = self._inp
        problems = self._faults(await self._health())
        gpu: GpuCheckResult | None = None
        if inp.checks.host_agent:
            try:
                gpu = await self._agent(HostAgentActivities.host_gpu_check, check, timedelta(minutes=5), "GPU check")
                problems += [f"GPU check: {finding_text(f)}" for f in self._blame(gpu)]
            except _Unavailable as err:
                problems.append(str(err))
        if inp.checks.bmc and bmc is not None:
            seen: RedfishHealth = await self._calls.execute(
                RedfishActivities.redfish_health, bmc, **BMC_CALL, endpoint=bmc_endpoint(bmc), summary="BMC health"
            )
            problems += bmc_problems(BmcObservation(**seen.model_dump()), inp.checks)[0]
        return problems, gpu

    def _faults(self, health: NodeHealth) -> list[str]:
        """What the node object shows wrong, NotReady with no grace (after a fix, or a wait, it has had its time)."""
        problems, _ = node_problems(health, self._inp.checks, health.decided_at(workflow.now()))
        if not health.ready and "NotReady" not in " ".join(problems):
            problems.append("NotReady")
        return problems

    def _blame(self, seen: Any) -> list[Any]:
        """The failing findings of a GPU check or verdict; remembers those only an RMA fixes."""
        failed = [f for f in seen.findings if f.severity == "fail"]
        self._rma = [finding_text(f) for f in failed if f.remedy == "rma"]
        return failed

    async def _health(self) -> NodeHealth:
        inp = self._inp
        return await self._calls.execute(
            NodeHealthActivities.read_node_health,
            NodeHealthRequest(cluster=inp.cluster, node=inp.node, condition_types=inp.checks.condition_types(),
                              label_keys=inp.checks.label_keys()),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary="read node health")  # fmt: skip

    # ------------------------------------------------------------ the end of the ladder

    async def _quarantine(self, result: NodeRemediationResult, owner: str, bmc: BmcRef | None) -> NodeRemediationResult:
        inp = self._inp
        tried = "; ".join(f"{s.step}: {s.outcome}" + (f" ({s.detail})" if s.detail else "") for s in self._status.steps)
        if self._rma:
            why = f"{inp.reason}; needs an RMA: {'; '.join(self._rma)}" + (f" (tried {tried})" if tried else "")
        else:
            why = f"{inp.reason}; remediation exhausted ({tried})"
        why = why[:1024]
        self._enter("quarantining", why)
        await self._calls.execute(
            NodeHealthActivities.quarantine_node, QuarantineRequest(cluster=inp.cluster, node=inp.node, owner=owner,
                                                                    reason=why),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"quarantine {inp.node}")  # fmt: skip
        result.quarantined = True
        if inp.netbox:
            result.netbox = await self._records.quarantine_in_netbox(why)
        # The node stays cordoned, so the budget keeps counting it as out of service without our lease.
        return await self._conclude(result, "quarantined", why, event="node-quarantined",
                                    lease="quarantined; the node stays cordoned")  # fmt: skip

    async def _conclude(self, result: NodeRemediationResult, outcome: Outcome, note: str, *, event: str, lease: str,
                        lease_first: bool = True, mark: bool = True) -> NodeRemediationResult:  # fmt: skip
        """Return the lease and record the outcome, then notify the webhook: one that does not answer delays the
        run's end by at most notify_timeout and never changes its outcome."""
        if mark:
            await self._records.mark_remediated(outcome)
        if self._inp.webhook is not None and not workflow.patched(NOTIFY_AFTER_OUTCOME_PATCH):
            # A history from before: the webhook first (after a failed drain, before the lease), then the outcome.
            if lease_first:
                await self._return_lease(lease)
            self._enter("notifying", event)
            await self._records.notify(event, result, note)
            if not lease_first:
                await self._return_lease(lease)
            return self._finish(result, outcome, note)
        await self._return_lease(lease)
        self._finish(result, outcome, note)
        await self._records.notify(event, result, note)
        return result

    async def _return_lease(self, reason: str = "") -> None:
        if self._lease is not None:
            await leases.release_lease(self._inp.cluster, self._inp.node, reason=reason)
            self._lease = None
            self._status.lease = False

    # ------------------------------------------------------------ inventory and visibility

    async def _inventory(self, inp: NodeRemediationInput) -> tuple[BmcRef | None, int | None, str | None]:
        """The BMC and expected GPUs: from the input, else (netbox: true) from the NetBox device."""
        bmc, gpus, model = inp.bmc, inp.expected_gpus, inp.gpu_model
        if inp.netbox and (bmc is None or gpus is None or model is None):
            found = await self._calls.execute(
                NetBoxActivities.find_device, DeviceLookup(name=inp.node), **NETBOX_CALL, summary="NetBox: find device"
            )
            if found.device is not None:
                from_nb = device_facts(found.device)
                bmc = bmc or from_nb.bmc
                gpus = gpus if gpus is not None else from_nb.gpus
                model = model or from_nb.gpu_model
        return bmc, gpus, model

    def _enter(self, phase: str, details: str = "") -> None:
        self._status.phase = phase
        self._phases.enter(phase, details)
        self._details()

    def _waiting(self, waits: list[EndpointWait]) -> None:
        self._phases.progress.waiting = waits
        self._details()

    def _details(self) -> None:
        s, inp = self._status, self._inp
        lines = [f"**{s.phase}** node `{inp.node}` in `{inp.cluster}`: {inp.reason}"]
        if s.awaiting_approval:
            a = s.awaiting_approval
            lines.append(f"waiting for `approve`/`reject` of **{a.step}** (default {a.default} at {a.deadline})")
        if s.to_evict:
            lines.append(f"{len(s.evicted)}/{s.to_evict} pods evicted")
        for b in list(s.blocked.values())[:3]:
            lines.append(f"blocked: {b.pod} by {b.budget or 'the API'}: {b.message}")
        for r in s.steps:
            lines.append(f"- {r.step}: {r.outcome}" + (f" ({r.detail})" if r.detail else ""))
        if s.problems and s.phase in ("re-checking", "burn-in"):
            lines.append("problems: " + "; ".join(s.problems[:5]))
        if s.note:
            lines.append(s.note)
        shown = self._phases.progress.finished or s.phase == breaker_wait.PHASE  # why it ended, or why it waits
        self._phases.progress.details = lines[0] + (f" — {s.note}" if s.note and shown else "")
        workflow.set_current_details(with_waits("\n\n".join(lines), self._phases.progress.waiting))

    def _finish(self, result: NodeRemediationResult, outcome: Outcome, note: str) -> NodeRemediationResult:
        result.outcome, result.steps = outcome, list(self._status.steps)
        result.add(self._status)  # what its drain cost the GPU work on the node
        result.note = "; ".join(n for n in (note, self._status.note) if n)
        self._status.note = result.note  # why the run ended so, in its status, progress and details too
        self._enter(outcome, note)
        return result


class _Unavailable(Exception):
    """A step that cannot run here: no host agent, no BMC."""
