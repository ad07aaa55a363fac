"""Remediation of unhealthy nodes: `NodeRemediation` (one node, a ladder of fixes) and `FleetHealthSweep`
(scheduled: find the unhealthy nodes and start one `NodeRemediation` each).

NodeRemediation, for one node (workflow ID `remediation/<cluster>/<node>`, so a node is never remediated
twice at once):

  lease from the cluster's disruption budget → cordon (ownership on the node) → drain (the drain node
  maintenance uses) → for each step of the ladder (`restart-gpu-services`, `reset-gpu` through the node's host
  agent; `power-cycle` through Redfish, Off then On, waiting for Ready with a new boot ID), optionally after an
  operator's approval: its success check (node conditions clear, the host agent's GPU check clean, the BMC's
  health rollup not critical, within `settle_timeout`), then a short burn-in (GPU check, stress, GPU check,
  `gpu_verdict`) → healthy: uncordon, return the lease.

  A remediation's lease counts towards the cluster's circuit breaker (workflows/remediation_breaker.py): while it
  is tripped (or when this node would trip it) the lease is refused and the run ends `refused`, touching nothing.
  When it ends (healthy, quarantined, failed) it annotates the node `millwright.dev/last-remediation` (when, by
  whom, how), which the sweep's per-node cooldown reads.

  Ladder exhausted: quarantine — the node stays cordoned, with the reason in an annotation and a
  `millwright.dev/quarantine:NoSchedule` taint; NetBox `failed` with a journal entry and the
  `millwright-quarantine` tag; the lease is kept (the node stays out of service); a webhook notification.

FleetHealthSweep reads every node's conditions, dcgm-exporter's GPU fault series in Prometheus (one query a
slice; no MILLWRIGHT_PROMETHEUS_URL: not used, and said), the host agents' GPU checks (no agent: unknown) and the
BMCs' health, decides with `workflows.remediation_policy.decide` (a node opted out by label, or remediated less
than `cooldown` ago, is skipped), and once every node of a cluster is decided starts at most `max_remediations`
children with the node-derived ID and `ParentClosePolicy.ABANDON` (they outlive the sweep) — none at all, and it
says why, while fewer than `min_healthy` of the cluster's nodes are healthy or its remediation circuit breaker is
tripped. A start that finds the node's
remediation already running (another sweep, a manual start) is reported as such, never duplicated. It reads and
probes the nodes in slice children of a few hundred nodes each and continues as new with a cursor, so that no run
passes ~8,300 history events at 10,000 nodes (the class's docstring counts them).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    TimeoutError,
    TimeoutType,
    WorkflowAlreadyStartedError,
)

from workflows import priorities
from workflows import search_attributes as sa
from workflows.base import Phases, Progress, WorkflowInput, history_is_long
from workflows.burnin import AGENT_RETRY, BMC_CALL, BMC_RETRY, NETBOX_CALL, bmc_endpoint
from workflows.carried import outcome_of
from workflows.endpoints import EndpointWait, Endpoints, RetryTimeout, error_text, kubernetes_api, with_waits
from workflows.drain import API_CALL, API_RETRY, Drain, DrainProgress
from workflows.remediation_policy import (
    DEFAULT_COOLDOWN,
    AgentObservation,
    BmcObservation,
    HealthChecks,
    MinHealthy,
    NodeDecision,
    bmc_problems,
    decide,
    node_problems,
    remediation_workflow_id,
    too_few_healthy,
)

from activities.gpu import (
    EmptyRequest,
    GpuCheckRequest,
    GpuCheckResult,
    GpuResetRequest,
    HostAgentActivities,
    StressRequest,
    StressResult,
    gpu_verdict,
    host_task_queue,
)
from activities.kube import (
    CordonRequest,
    DrainSettings,
    KubeActivities,
    NodeRef,
    RebootWait,
    validate_label_selector,
    validate_object_name,
    validate_positive_duration,
)
from activities.entities import EntityActivities, RunOutcome, RunRef, WorkflowQuery, failed_outcome
from activities.models import StrictModel
from activities.netbox import (
    CF_BMC_CREDENTIALS,
    CF_BMC_URL,
    CF_EXPECTED_GPUS,
    CF_GPU_MODEL,
    TAG_QUARANTINE,
    DeviceInfo,
    DeviceLookup,
    DevicePage,
    DevicePageQuery,
    DeviceQuery,
    DeviceTagsRequest,
    NetBoxActivities,
    SetStatusRequest,
)
from activities.node_health import (
    NodeHealth,
    NodeHealthActivities,
    NodeHealthQuery,
    NodeHealthRequest,
    NodeNamesPage,
    NodeNamesQuery,
    NodesHealth,
    NodesHealthRequest,
    QuarantineRequest,
    RemediatedMark,
)
from activities.notify import NotifyActivities, WebhookDelivery, WebhookNotification, WebhookTarget
from activities.prometheus import DcgmFaults, DcgmFaultsQuery, GpuFault, PrometheusActivities
from activities.redfish import BmcRef, PowerRequest, RedfishActivities, RedfishHealth
from workflows import leases
from workflows.remediation_breaker import BREAKER_QUERY, BreakerSettings, BreakerView
from workflows.rollout_spec import Budget

Step = Literal["restart-gpu-services", "reset-gpu", "power-cycle"]
STEPS: tuple[Step, ...] = ("restart-gpu-services", "reset-gpu", "power-cycle")
Outcome = Literal["healthy", "quarantined", "failed", "skipped", "refused"]
StepOutcome = Literal["fixed", "not-fixed", "unavailable", "rejected", "failed"]

# BMC, NetBox and host-agent calls are made as burn-in makes them (workflows.burnin: BMC_CALL, NETBOX_CALL,
# AGENT_RETRY); every call to an endpoint is bounded by retry_timeout, a webhook's by notify_timeout, and
# the outcome is recorded before the webhook is notified (NOTIFY_AFTER_OUTCOME_PATCH).
NOTIFY_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(seconds=30),
                   retry_policy=RetryPolicy(initial_interval=timedelta(seconds=2), backoff_coefficient=2.0,
                                            maximum_interval=timedelta(seconds=30)))  # fmt: skip
NOTIFY_AFTER_OUTCOME_PATCH = "remediation-notify-after-outcome"
MARK_REMEDIATED_PATCH = "remediation-mark-remediated"  # the last-remediation annotation at the end of a run
HEARTBEAT = timedelta(seconds=30)


# ---------------------------------------------------------------- models


class RemediationSettings(RetryTimeout):
    """How a node is remediated: the ladder, approvals, timeouts, records. Shared by the sweep's children."""

    steps: list[Step] = Field(default_factory=lambda: list(STEPS), min_length=1,
                              description="The ladder, cheapest first; each step is tried once.")  # fmt: skip
    drain: DrainSettings = Field(default_factory=DrainSettings)
    require_approval_for: list[Step] = Field(
        default_factory=list, description="Steps that wait for an operator's `approve` / `reject` update."
    )
    approval_timeout: timedelta = Field(timedelta(hours=1), description="How long to wait for an approval.")
    default_on_timeout: Literal["approve", "reject"] = Field(
        "reject", description="What an approval nobody gave within approval_timeout becomes."
    )
    settle_timeout: timedelta = Field(
        timedelta(minutes=3), description="After a step, how long the node may take to look healthy."
    )
    settle_poll_interval: timedelta = Field(timedelta(seconds=10), description="How often to look meanwhile.")
    agent_timeout: timedelta = Field(
        timedelta(minutes=2), description="How long the host agent may take to pick up a task (none: unavailable)."
    )
    reboot_timeout: timedelta = Field(timedelta(minutes=20), description="Power cycle to Ready with a new boot ID.")
    burn_in_seconds: float = Field(60.0, gt=0, le=3600, description="The short GPU stress after a fix.")
    dcgm_level: int | None = Field(None, ge=1, le=4, description="dcgmi diag level during burn-in (when installed).")
    expected_gpus: int | None = Field(None, ge=0, le=64, description="GPUs the node must have (None: not checked).")
    gpu_model: str | None = Field(None, description="e.g. NVIDIA H200 (None: not checked).")
    disruption_budget: bool = Field(True, description="Take a lease from the cluster's disruption budget first.")
    budget: Budget | None = Field(None, description="The cluster's budget, if it has none yet but the default (10%).")
    breaker: BreakerSettings = Field(default_factory=BreakerSettings, description="When the cluster's remediation "
                                     "circuit breaker trips (with disruption_budget: the entity holds it).")  # fmt: skip
    netbox: bool = Field(False, description="Record a quarantine in NetBox; look the BMC and GPUs up there.")
    webhook: WebhookTarget | None = Field(None, description="Where to notify a quarantine or a failure.")
    notify_timeout: timedelta = Field(
        timedelta(minutes=10), description="How long the webhook may keep failing (no answer, 5xx, 429) before the "
        "notification is given up; the outcome is recorded first, and the result's `notification` says what became "
        "of it.")  # fmt: skip

    _durations = field_validator("approval_timeout", "settle_timeout", "settle_poll_interval", "agent_timeout",
                                 "reboot_timeout", "notify_timeout")(validate_positive_duration)  # fmt: skip

    @field_validator("steps")
    @classmethod
    def _unique(cls, steps: list[Step]) -> list[Step]:
        if len(set(steps)) != len(steps):
            raise ValueError("each step at most once")
        return steps


class NodeRemediationInput(WorkflowInput, RemediationSettings):
    """Remediate one node of one cluster, for a stated reason."""

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    node: str = Field(description="Node name (also the host agent's name and the NetBox device name).")
    reason: str = Field(min_length=1, max_length=1024, description="Why; recorded on the node.")
    checks: HealthChecks = Field(default_factory=HealthChecks, description="What the success checks look at.")
    bmc: BmcRef | None = Field(None, description="The node's BMC; None: from NetBox (netbox: true), else no "
                               "power cycle.")  # fmt: skip

    _names = field_validator("cluster", "node")(validate_object_name)

    def workflow_id(self) -> str:
        return remediation_workflow_id(self.cluster, self.node)

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster), SearchAttributePair(sa.NODE, self.node)]


class StepRecord(StrictModel):
    step: Step
    outcome: StepOutcome
    detail: str = ""
    approval: str | None = Field(None, description="Who approved or rejected, or 'default on timeout'.")


class Approval(StrictModel):
    step: Step | None = Field(None, description="The step being decided; None: whichever waits now.")
    by: str = Field(min_length=1, description="Who decides.")
    comment: str = ""


class AwaitingApproval(StrictModel):
    step: Step
    deadline: str
    default: Literal["approve", "reject"]


class NodeRemediationStatus(DrainProgress):
    phase: str = "starting"
    step: Step | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    awaiting_approval: AwaitingApproval | None = None
    lease: bool = False
    cordoned_by_us: bool = False
    problems: list[str] = Field(default_factory=list, description="What the last check found.")
    note: str = ""


class NodeRemediationResult(StrictModel):
    cluster: str
    node: str
    outcome: Outcome
    reason: str
    fixed_by: Step | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    uncordoned: bool = False
    quarantined: bool = False
    netbox: str | None = Field(None, description="What was recorded in NetBox, or why nothing was.")
    notified: bool = False
    notification: str | None = Field(None, description="The webhook notification: delivered, or failed after N "
                                     "attempts with the error (never the run's failure).")  # fmt: skip
    note: str = ""


class _Rejected(Exception):
    pass


# ---------------------------------------------------------------- NodeRemediation


@workflow.defn
class NodeRemediation:
    @workflow.init
    def __init__(self, inp: NodeRemediationInput) -> None:
        self._inp = inp
        self._status = NodeRemediationStatus()
        self._phases = Phases(finished=("healthy", "quarantined", "failed", "skipped", "refused"))
        self._calls = Endpoints(inp.retry_timeout, shown=self._waiting, priority=priorities.remediation(inp.cluster))
        self._decisions: dict[Step, tuple[Literal["approve", "reject"], Approval]] = {}
        self._lease: Any = None
        self._rma: list[str] = []  # findings whose remedy is an RMA: no step of the ladder fixes them

    # ------------------------------------------------------------ queries and updates

    @workflow.query(description="Phase, ladder steps done with their outcomes, approval awaited, drain progress.")
    def status(self) -> NodeRemediationStatus:
        return self._status

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.update(description="Approve the step that waits for an operator (e.g. the power cycle).")
    async def approve(self, req: Approval) -> NodeRemediationStatus:
        return self._decide("approve", req)

    @approve.validator
    def _validate_approve(self, req: Approval) -> None:
        self._check_awaiting(req)

    @workflow.update(description="Reject the step that waits for an operator: the ladder goes on without it.")
    async def reject(self, req: Approval) -> NodeRemediationStatus:
        return self._decide("reject", req)

    @reject.validator
    def _validate_reject(self, req: Approval) -> None:
        self._check_awaiting(req)

    def _check_awaiting(self, req: Approval) -> None:
        waiting = self._status.awaiting_approval
        if waiting is None:
            raise ValueError(f"no step is waiting for approval (phase {self._status.phase})")
        if req.step is not None and req.step != waiting.step:
            raise ValueError(f"step {req.step} is not waiting for approval; {waiting.step} is")

    def _decide(self, decision: Literal["approve", "reject"], req: Approval) -> NodeRemediationStatus:
        waiting = self._status.awaiting_approval
        if waiting is not None and waiting.step not in self._decisions:
            self._decisions[waiting.step] = (decision, req)
        return self._status

    # ------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: NodeRemediationInput) -> NodeRemediationResult:
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster), sa.NODE.value_set(inp.node)])
        self._phases.progress.total = len(inp.steps)
        result = NodeRemediationResult(cluster=inp.cluster, node=inp.node, outcome="healthy", reason=inp.reason)
        owner = workflow.info().workflow_id
        cordon = CordonRequest(cluster=inp.cluster, node=inp.node, owner=owner, reason=f"remediation: {inp.reason}")
        self._enter("starting", inp.reason)
        bmc, gpus, model = await self._inventory(inp)
        # A node quarantined earlier and remediated again (an operator's retry): fixed, its quarantine is lifted.
        quarantined = (await self._health()).quarantined

        if inp.disruption_budget:
            self._enter("waiting-for-budget", f"a lease on cluster {inp.cluster}")
            lease = await leases.acquire_lease(
                inp.cluster, inp.node, holder=owner, reason=f"remediation: {inp.reason}", budget=inp.budget,
                waiting=lambda lease: self._enter("waiting-for-budget", f"place {lease.position}: {lease.note}"),
                remediation=inp.breaker)  # fmt: skip
            if lease is not None and lease.state == "refused":  # the node was never touched
                return self._finish(result, "refused", lease.note)
            self._lease = lease
            self._status.lease = True

        self._enter("cordoning")
        try:
            held = await self._calls.execute(KubeActivities.cordon_node, cordon, **API_CALL,
                                             endpoint=kubernetes_api(inp.cluster), summary=f"cordon {inp.node}")
        except ApplicationError as err:
            return await self._gave_up(result, err, "the node is left as it is (the cordon may have landed)")
        self._status.cordoned_by_us = held.owned
        if not held.owned:
            await self._return_lease("cordoned by someone else")
            return self._finish(result, "skipped", f"cordoned by {held.holder}; left to them")
        try:
            return await self._remediate(inp, result, cordon, owner, bmc, gpus, model, quarantined)
        except ApplicationError as err:
            return await self._gave_up(result, err, "the node stays cordoned")

    async def _gave_up(self, result: NodeRemediationResult, err: ApplicationError, left: str) -> NodeRemediationResult:
        """A call gave up on its endpoint (workflows.endpoints): the node is left cordoned, the failure is the
        outcome (as after a failed drain)."""
        if err.type != "EndpointUnavailable":
            raise err
        why = f"gave up: {err.message}; {left}"
        # No mark on the node: the API just gave up on us.
        return await self._conclude(result, "failed", why, event="remediation-failed", lease=f"gave up; {left}",
                                    mark=False)  # fmt: skip

    async def _remediate(self, inp: NodeRemediationInput, result: NodeRemediationResult, cordon: CordonRequest,
                         owner: str, bmc: BmcRef | None, gpus: int | None, model: str | None,
                         quarantined: str | None) -> NodeRemediationResult:  # fmt: skip
        """Drain, climb the ladder, and uncordon (fixed) or quarantine (exhausted): the node is cordoned by us."""
        self._enter("draining")
        try:
            await Drain(inp.cluster, inp.node, inp.drain, self._status, priority=priorities.remediation(inp.cluster),
                        stopping=lambda: False,
                        changed=self._details).run()  # fmt: skip
        except (ActivityError, ApplicationError) as err:
            health = await self._health()
            if health.ready:  # a live node that cannot be drained must not be power cycled
                why = f"drain failed: {_cause(err)}"
                return await self._conclude(result, "failed", f"{why}; the node stays cordoned",
                                            event="remediation-failed", lease="drain failed; the node stays cordoned",
                                            lease_first=False)  # fmt: skip
            self._status.note = f"drain incomplete on a NotReady node: {_cause(err)}"

        check = GpuCheckRequest(expected_count=gpus, expected_model=model, report_unavailable=True)
        if inp.checks.host_agent:
            # A finding no step can fix (a row-remap failure: RMA) sends the node to quarantine at once.
            self._enter("diagnosing", "GPU check")
            try:
                self._blame(await self._agent(HostAgentActivities.host_gpu_check, check, timedelta(minutes=5),
                                              "GPU check before the ladder"))  # fmt: skip
            except (_Unavailable, ActivityError) as err:
                self._status.note = f"no GPU check before the ladder: {_cause(err)}"
        for i, step in enumerate(inp.steps):
            if self._rma:
                break
            record = await self._try_step(step, bmc, check)
            self._status.steps.append(record)
            self._phases.progress.done = i + 1
            if record.outcome == "fixed":
                result.fixed_by = step
                if quarantined:
                    await self._lift_quarantine(result, owner, f"fixed by {step}")
                self._enter("uncordoning", f"fixed by {step}")
                done = await self._calls.execute(KubeActivities.uncordon_node, cordon, **API_CALL,
                                                 endpoint=kubernetes_api(inp.cluster), summary=f"uncordon {inp.node}")
                result.uncordoned = done.uncordoned
                await self._return_lease(f"fixed by {step}")
                await self._mark_remediated("healthy")
                return self._finish(result, "healthy", f"fixed by {step}")
        return await self._quarantine(result, owner, bmc)

    # ------------------------------------------------------------ the ladder

    async def _try_step(self, step: Step, bmc: BmcRef | None, check: GpuCheckRequest) -> StepRecord:
        inp = self._inp
        self._status.step = step
        approval: str | None = None
        if step in inp.require_approval_for:
            try:
                approval = await self._approval(step)
            except _Rejected as rejected:
                return StepRecord(step=step, outcome="rejected", approval=str(rejected))
        self._enter(step)
        try:
            detail = await self._act(step, bmc, check)
        except _Unavailable as err:
            return StepRecord(step=step, outcome="unavailable", detail=str(err), approval=approval)
        except (ActivityError, ApplicationError) as err:
            return StepRecord(step=step, outcome="failed", detail=_cause(err), approval=approval)
        try:
            healthy, why = await self._verify(bmc, check)
        except (ActivityError, ApplicationError) as err:
            healthy, why = False, f"check failed: {_cause(err)}"
        return StepRecord(step=step, outcome="fixed" if healthy else "not-fixed",
                          detail="; ".join(d for d in (detail, why) if d), approval=approval)  # fmt: skip

    async def _approval(self, step: Step) -> str:
        """Wait for `approve` / `reject`; the default after approval_timeout. Returns who approved."""
        inp = self._inp
        deadline = workflow.now() + inp.approval_timeout
        self._status.awaiting_approval = AwaitingApproval(step=step, deadline=deadline.isoformat(),
                                                          default=inp.default_on_timeout)  # fmt: skip
        self._enter("awaiting-approval", f"{step}: `approve` or `reject` (default {inp.default_on_timeout} "
                                         f"at {deadline.isoformat()})")  # fmt: skip
        try:
            await workflow.wait_condition(lambda: step in self._decisions, timeout=inp.approval_timeout,
                                          timeout_summary=f"approval of {step}")  # fmt: skip
            decision, req = self._decisions[step]
            who = f"{req.by}" + (f": {req.comment}" if req.comment else "")
        except asyncio.TimeoutError:
            decision, who = inp.default_on_timeout, f"default on timeout ({inp.approval_timeout})"
        finally:
            self._status.awaiting_approval = None
        if decision == "reject":
            raise _Rejected(who)
        return who

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
        info = await self._calls.execute(KubeActivities.inspect_node, NodeRef(cluster=inp.cluster, node=inp.node),
                                         **API_CALL, endpoint=kubernetes_api(inp.cluster), summary="read boot ID")
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
            raise ApplicationError(f"power cycled, but {_cause(err)}", type="RebootTimeout") from None
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
            if isinstance(err.cause, TimeoutError) and err.cause.type == TimeoutType.SCHEDULE_TO_START:
                raise _Unavailable(f"no host agent picked up '{summary}' within {self._inp.agent_timeout}") from None
            raise

    async def _verify(self, bmc: BmcRef | None, check: GpuCheckRequest) -> tuple[bool, str]:
        """The step's success check: conditions, GPU check and BMC clear within settle_timeout, then burn-in."""
        inp = self._inp
        self._enter("re-checking")
        deadline = workflow.now() + inp.settle_timeout
        while True:
            problems, before = await self._problems(bmc, check)
            self._status.problems = problems
            if not problems:
                break
            remaining = deadline - workflow.now()
            if remaining <= timedelta(0):
                return False, "still unhealthy: " + "; ".join(problems)
            self._details()
            await workflow.sleep(min(inp.settle_poll_interval, remaining), summary="let the node settle")
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
            self._status.problems = [_finding(f) for f in failed]
            return False, "burn-in failed: " + "; ".join(self._status.problems)
        return True, "checks clear; burn-in passed"

    async def _problems(self, bmc: BmcRef | None, check: GpuCheckRequest) -> tuple[list[str], GpuCheckResult | None]:
        inp = self._inp
        health = await self._health()
        problems, _ = node_problems(health, inp.checks, workflow.now())
        if not health.ready and "NotReady" not in " ".join(problems):
            problems.append("NotReady")  # no grace after a fix
        gpu: GpuCheckResult | None = None
        if inp.checks.host_agent:
            try:
                gpu = await self._agent(HostAgentActivities.host_gpu_check, check, timedelta(minutes=5), "GPU check")
                problems += [f"GPU check: {_finding(f)}" for f in self._blame(gpu)]
            except _Unavailable as err:
                problems.append(str(err))
        if inp.checks.bmc and bmc is not None:
            seen: RedfishHealth = await self._calls.execute(
                RedfishActivities.redfish_health, bmc, **BMC_CALL, endpoint=bmc_endpoint(bmc), summary="BMC health")
            problems += bmc_problems(BmcObservation(**seen.model_dump()), inp.checks)[0]
        return problems, gpu

    def _blame(self, seen: Any) -> list[Any]:
        """The failing findings of a GPU check or verdict; remembers those only an RMA fixes."""
        failed = [f for f in seen.findings if f.severity == "fail"]
        self._rma = [_finding(f) for f in failed if f.remedy == "rma"]
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
            result.netbox = await self._record_in_netbox(why)
        # The node stays cordoned, so the budget keeps counting it as out of service without our lease.
        return await self._conclude(result, "quarantined", why, event="node-quarantined",
                                    lease="quarantined; the node stays cordoned")  # fmt: skip

    async def _conclude(self, result: NodeRemediationResult, outcome: Outcome, note: str, *, event: str, lease: str,
                        lease_first: bool = True, mark: bool = True) -> NodeRemediationResult:  # fmt: skip
        """Return the lease and record the outcome, then notify the webhook: one that does not answer delays the
        run's end by at most notify_timeout and never changes its outcome."""
        if mark:
            await self._mark_remediated(outcome)
        if self._inp.webhook is not None and not workflow.patched(NOTIFY_AFTER_OUTCOME_PATCH):
            # A history from before: the webhook first (after a failed drain, before the lease), then the outcome.
            if lease_first:
                await self._return_lease(lease)
            self._enter("notifying", event)
            await self._notify(event, result, note)
            if not lease_first:
                await self._return_lease(lease)
            return self._finish(result, outcome, note)
        await self._return_lease(lease)
        self._finish(result, outcome, note)
        await self._notify(event, result, note)
        return result

    async def _lift_quarantine(self, result: NodeRemediationResult, owner: str, why: str) -> None:
        inp = self._inp
        self._enter("lifting-quarantine", why)
        await self._calls.execute(
            NodeHealthActivities.release_quarantine, QuarantineRequest(cluster=inp.cluster, node=inp.node, owner=owner,
                                                                       reason=why),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"lift the quarantine of {inp.node}")  # fmt: skip
        if inp.netbox:
            device = DeviceLookup(name=inp.node)
            try:
                await self._calls.execute(
                    NetBoxActivities.set_device_status,
                    SetStatusRequest(device=device, status="active", kind="success",
                                     reason=f"Quarantine lifted by remediation `{owner}`: {why}"),
                    **NETBOX_CALL, summary="NetBox: status active")  # fmt: skip
                await self._calls.execute(
                    NetBoxActivities.set_device_tags, DeviceTagsRequest(device=device, remove=[TAG_QUARANTINE]),
                    **NETBOX_CALL, summary=f"NetBox: untag {TAG_QUARANTINE}")  # fmt: skip
                result.netbox = f"status active, tag {TAG_QUARANTINE} removed"
            except (ActivityError, ApplicationError) as err:
                self._status.note = f"NetBox not updated: {_cause(err)}"
        self._status.note = "; ".join(n for n in (self._status.note, "quarantine lifted") if n)

    async def _record_in_netbox(self, why: str) -> str:
        device = DeviceLookup(name=self._inp.node)
        try:
            change = await self._calls.execute(
                NetBoxActivities.set_device_status,
                SetStatusRequest(device=device, status="failed", kind="danger",
                                 reason=f"Quarantined by remediation `{workflow.info().workflow_id}`: {why}"),
                **NETBOX_CALL, summary="NetBox: status failed")  # fmt: skip
            await self._calls.execute(
                NetBoxActivities.set_device_tags, DeviceTagsRequest(device=device, add=[TAG_QUARANTINE]),
                **NETBOX_CALL, summary=f"NetBox: tag {TAG_QUARANTINE}")  # fmt: skip
        except (ActivityError, ApplicationError) as err:  # quarantined either way; say what NetBox did not get
            self._status.note = f"NetBox not updated: {_cause(err)}"
            return self._status.note
        return f"status {change.previous} → failed, journal entry #{change.journal_entry_id}, tag {TAG_QUARANTINE}"

    async def _notify(self, event: str, result: NodeRemediationResult, why: str) -> None:
        """POST the event to the webhook, retried within notify_timeout; what became of it goes in the result."""
        inp = self._inp
        if inp.webhook is None:
            return
        info = workflow.info()
        payload = {
            "cluster": inp.cluster, "node": inp.node, "reason": why, "workflow_id": info.workflow_id,
            "run_id": info.run_id, "steps": [s.model_dump() for s in self._status.steps],
            "quarantined": result.quarantined, "netbox": result.netbox,
        }  # fmt: skip
        try:
            delivery: WebhookDelivery = await self._calls.execute(
                NotifyActivities.notify_webhook,
                WebhookNotification(target=inp.webhook, event=event, payload=payload,
                                    idempotency_key=f"{info.workflow_id}/{info.run_id}/{event}"),
                **NOTIFY_CALL, endpoint=f"webhook {inp.webhook.url}", retry_timeout=inp.notify_timeout,
                setting="notify_timeout", summary=f"notify {event}")  # fmt: skip
        except (ActivityError, ApplicationError) as err:
            gave_up = err.details[0] if isinstance(err, ApplicationError) and err.type == "EndpointUnavailable" \
                else None  # fmt: skip
            tries = f" after {gave_up['attempts']} attempts" if gave_up else ""
            result.notification = f"{event}: failed{tries}: {gave_up['error'] if gave_up else error_text(err)}"
            self._status.note = "; ".join(n for n in (self._status.note, f"webhook not notified: {_cause(err)}") if n)
        else:
            result.notified = True
            result.notification = f"{event}: delivered (HTTP {delivery.status}, attempt {delivery.attempt})"
        result.note = "; ".join(n for n in (result.note, None if result.notified else "webhook not notified") if n)
        self._details()

    async def _mark_remediated(self, outcome: Outcome) -> None:
        """Annotate how this remediation ended, for the sweep's cooldown; a failure to is noted, never the outcome."""
        if not workflow.patched(MARK_REMEDIATED_PATCH):
            return
        inp = self._inp
        mark = RemediatedMark(cluster=inp.cluster, node=inp.node, owner=workflow.info().workflow_id, outcome=outcome,
                              at=workflow.now())  # fmt: skip
        try:
            await self._calls.execute(NodeHealthActivities.mark_remediated, mark, **API_CALL,
                                      endpoint=kubernetes_api(inp.cluster), summary=f"mark {inp.node} remediated")
        except (ActivityError, ApplicationError) as err:
            self._status.note = "; ".join(n for n in (self._status.note, f"not marked remediated: {_cause(err)}") if n)

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
                NetBoxActivities.find_device, DeviceLookup(name=inp.node), **NETBOX_CALL, summary="NetBox: find device")
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
        self._phases.progress.details = lines[0]
        workflow.set_current_details(with_waits("\n\n".join(lines), self._phases.progress.waiting))

    def _finish(self, result: NodeRemediationResult, outcome: Outcome, note: str) -> NodeRemediationResult:
        result.outcome = outcome
        result.steps = list(self._status.steps)
        result.note = "; ".join(n for n in (note, self._status.note) if n)
        self._enter(outcome, note)
        return result


class _Unavailable(Exception):
    """A step that cannot run here: no host agent, no BMC."""


class DeviceFacts(StrictModel):
    bmc: BmcRef | None = None
    gpus: int | None = None
    gpu_model: str | None = None


def device_facts(device: DeviceInfo) -> DeviceFacts:
    """The BMC and expected GPUs from a NetBox device's Millwright custom fields."""
    cf = device.custom_fields or {}
    bmc = None
    if cf.get(CF_BMC_URL):
        try:
            bmc = BmcRef(url=cf[CF_BMC_URL], credentials=cf.get(CF_BMC_CREDENTIALS) or None)
        except ValueError:
            bmc = None
    gpus = cf.get(CF_EXPECTED_GPUS)
    return DeviceFacts(bmc=bmc, gpus=gpus if isinstance(gpus, int) else None, gpu_model=cf.get(CF_GPU_MODEL) or None)


def _cause(err: BaseException) -> str:
    while isinstance(err, ActivityError) and err.cause is not None:
        err = err.cause
    return str(err)


def _finding(f: Any) -> str:
    where = f" GPU{f.gpu}" if getattr(f, "gpu", None) is not None else ""
    return f"{f.check}{where}: {f.evidence}"


# ---------------------------------------------------------------- FleetHealthSweep

# Sweeps started before slices read every node in the one run; replays of them take that path (`_sweep_whole`).
SWEEP_SLICES_PATCH = "fleet-health-sweep-slices"
# Sweeps from before it started a slice's remediations as the slice closed; since, once the whole cluster is
# decided (min_healthy), after asking the cluster's circuit breaker.
SWEEP_HOLD_PATCH = "fleet-health-sweep-min-healthy-breaker"
BREAKER_CALL = dict(start_to_close_timeout=timedelta(seconds=15), schedule_to_close_timeout=timedelta(minutes=1),
                    retry_policy=API_RETRY)  # fmt: skip
SWEEP_HISTORY_LIMIT = 6000  # the sweep continues as new past this, or at the server's suggestion (4,096 events)
LISTED = 500  # unhealthy nodes and remediations a result lists (the counts stay exact): results stay small
HELD = 250  # nodes to remediate a sweep holds until their cluster is decided: one cluster's starts ≤ 2,250 events
NAMES_PER_CALL = 5000  # node names one listing activity returns (~100 KB)
SLICE_TIMEOUT = timedelta(hours=6)  # a slice's execution timeout, far above what its probes' own bounds allow
NAMES_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(minutes=2), heartbeat_timeout=timedelta(seconds=30),
                  retry_policy=API_RETRY)  # fmt: skip
READ_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(minutes=5), heartbeat_timeout=timedelta(seconds=30),
                 retry_policy=API_RETRY)  # fmt: skip
# A slice reads dcgm-exporter's GPU faults in one query (sweeps started before it read none). Prometheus not
# answering within DCGM_CALL's bound leaves the signal unknown for that slice (said), never the sweep stuck.
DCGM_PATCH = "fleet-health-sweep-dcgm"
DCGM_CALL = dict(start_to_close_timeout=timedelta(minutes=1), schedule_to_close_timeout=timedelta(minutes=3),
                 retry_policy=RetryPolicy(initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=30),
                                          non_retryable_error_types=["PrometheusRejected", "PrometheusBadResponse"]))  # fmt: skip


class StartedRemediation(StrictModel):
    cluster: str
    node: str
    workflow_id: str
    reasons: list[str]
    status: Literal["started", "already-running", "deferred", "dry-run", "error", "refused"]
    detail: str = ""


class ClusterSweep(StrictModel):
    cluster: str
    nodes: int = Field(0, description="Nodes listed (and given to slices).")
    healthy: int = 0
    not_healthy: int = Field(0, description="Nodes not healthy: to remediate, or skipped with why.")
    unhealthy: list[NodeDecision] = Field(default_factory=list, description=f"The nodes not healthy, with why (the "
                                          f"first {LISTED} of the sweep; `not_healthy` counts them all).")  # fmt: skip
    agents_unavailable: int = 0
    bmc_unknown: int = 0
    vanished: int = Field(0, description="Nodes deleted between the listing and their slice's read.")
    slices: int = Field(0, description="Slice children that swept this cluster's nodes.")
    refused: str | None = Field(None, description="Why no remediation was started in this cluster: too few healthy "
                                "nodes (min_healthy), or its circuit breaker tripped.")  # fmt: skip
    gpu_faults: int = Field(0, description="dcgm-exporter fault series above zero (any XID, ECC, row remap).")
    dcgm: str = Field("", description="Whether GPU faults were read from Prometheus, and from where; or why not.")
    error: str | None = None


class Candidate(StrictModel):
    """A node a slice found needing remediation, with what its NetBox device or `bmcs` say."""

    cluster: str
    decision: NodeDecision
    facts: DeviceFacts


class FleetHealthSweepResult(StrictModel):
    clusters: list[ClusterSweep]
    remediations: list[StartedRemediation] = Field(
        default_factory=list, description=f"What was started, already running, deferred (the first {LISTED}).")
    remediation_counts: dict[str, int] = Field(default_factory=dict, description="Remediations by status, all.")
    found: list[Candidate] = Field(default_factory=list, description="A slice's nodes needing remediation, for the "
                                   "sweep that started it; empty in a sweep's own result.")  # fmt: skip

    def started(self) -> list[StartedRemediation]:
        return [r for r in self.remediations if r.status == "started"]


class SweepSlice(StrictModel):
    """Nodes of one cluster that one child of a sweep owns."""

    cluster: str
    index: int = Field(ge=0)
    nodes: list[str] = Field(min_length=1, max_length=500)


class SliceRun(StrictModel):
    """A slice child the sweep started, as a later run of the sweep finds it again."""

    workflow_id: str
    run_id: str
    cluster: str
    index: int
    nodes: int
    first: str
    last: str


class SweepCursor(StrictModel):
    """Where a sweep stands, carried across continue-as-new."""

    cluster: int = Field(0, description="Index in `clusters` of the cluster being given out to slices.")
    after: str | None = Field(None, description="The last node (in name order) of that cluster given to a slice.")
    next_slice: int = 0
    running: list[SliceRun] = Field(default_factory=list)
    started: int = Field(0, description="Remediations started so far (max_remediations is per sweep).")
    held: list[Candidate] = Field(default_factory=list, description=f"Nodes to remediate in clusters not yet wholly "
                                  f"decided (at most {HELD}).")  # fmt: skip
    result: FleetHealthSweepResult


class FleetHealthSweepInput(WorkflowInput, RetryTimeout):
    """Find the unhealthy nodes of some clusters and start a NodeRemediation for each (at most max_remediations)."""

    clusters: list[str] = Field(min_length=1, description="Cluster references (kubeconfig contexts).")
    label_selector: str = Field("", description="Only nodes matching this label selector.")
    checks: HealthChecks = Field(default_factory=HealthChecks)
    max_remediations: int = Field(1, ge=0, description="At most this many NodeRemediations started per sweep.")
    min_healthy: MinHealthy = Field(
        default_factory=lambda: MinHealthy(percent=51), description="Start no remediation in a cluster while fewer "
        "of the nodes swept are healthy (Node Healthcheck's minHealthy; percent 0: never refuse).")  # fmt: skip
    cooldown: timedelta = Field(DEFAULT_COOLDOWN, description="A node remediated less than this long ago (its "
                                "millwright.dev/last-remediation annotation) is skipped; 0: no cooldown.")  # fmt: skip
    netbox: bool = Field(False, description="Look BMCs and expected GPUs up in NetBox; children record quarantines.")
    netbox_role: str | None = Field("gpu-server", description="NetBox device role of the nodes (with netbox).")
    bmcs: dict[str, BmcRef] = Field(default_factory=dict, description="BMC per node name (before NetBox's).")
    agent_timeout: timedelta = Field(timedelta(seconds=10), description="No host agent picking up the GPU check "
                                     "within this long: unknown, not unhealthy.")  # fmt: skip
    concurrency: int = Field(20, ge=1, le=200, description="Nodes probed at once, across the running slices.")
    slice_size: int = Field(250, ge=1, le=500, description="Nodes per slice child (each run stays under ~3,000 "
                            "history events at 250).")  # fmt: skip
    slices_at_once: int = Field(2, ge=1, le=20, description="Slice children running at once; each probes "
                                "concurrency / slices_at_once nodes at once, so the next slice is busy while one "
                                "finishes its last probes.")  # fmt: skip
    remediation: RemediationSettings = Field(default_factory=RemediationSettings,
                                             description="How each started NodeRemediation works.")  # fmt: skip
    dry_run: bool = Field(False, description="Decide and report; start nothing.")
    # Set by the sweep itself; not for callers.
    part: SweepSlice | None = Field(None, description="Internal: the nodes a slice child sweeps.")
    carried: SweepCursor | None = Field(None, description="Internal: carried across continue-as-new.")

    _selector = field_validator("label_selector")(validate_label_selector)
    _timeout = field_validator("agent_timeout")(validate_positive_duration)

    @field_validator("cooldown")
    @classmethod
    def _cooldown(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("must not be negative")
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_cluster(cls, data: Any) -> Any:
        """`{"cluster": "lab"}` is shorthand for `{"clusters": ["lab"]}`."""
        if isinstance(data, dict) and "cluster" in data and "clusters" not in data:
            data = {**data, "clusters": [data["cluster"]]}
            del data["cluster"]
        return data

    @field_validator("clusters")
    @classmethod
    def _names(cls, clusters: list[str]) -> list[str]:
        if len(set(clusters)) != len(clusters):
            raise ValueError("each cluster at most once")
        return clusters

    def workflow_id(self) -> str:
        return f"fleet-health-sweep/{'+'.join(self.clusters)}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.clusters[0])] if len(self.clusters) == 1 else []


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
      `EntityActivities.workflow_outcome` (workflows/carried.py) while it starts the next ones: slices keep probing
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
        self._calls = Endpoints(inp.retry_timeout, shown=self._waiting,
                                 priority=priorities.remediation(inp.clusters[0]))  # a slice: its cluster
        self._cursor = inp.carried or SweepCursor(result=FleetHealthSweepResult(clusters=[]))
        self._result = self._cursor.result
        self._running: dict[str, SliceRun] = {r.workflow_id: r for r in self._cursor.running}
        self._closed: list[tuple[SliceRun, FleetHealthSweepResult | str]] = []  # closed slices, not merged yet
        self._waits: set[asyncio.Task] = set()
        self._names: list[str] | None = None  # the current cluster's names not given out yet, listed by this run
        self._hold = False  # SWEEP_HOLD_PATCH: remediations start once their cluster is wholly decided
        self._progressed = False  # this run started or merged a slice (so continuing as new moves on)

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
                nodes, self._names = self._names[:inp.slice_size], self._names[inp.slice_size:]
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
            sweep.error = _cause(err)
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
        room = LISTED - sum(len(c.unhealthy) for c in self._result.clusters)
        sweep.unhealthy += part.unhealthy[:max(room, 0)]
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
        room = min(HELD, HELD if inp.dry_run else inp.max_remediations - cursor.started) - len(cursor.held)
        cursor.held += found[:max(room, 0)]
        for candidate in found[max(room, 0):]:
            why = f"max {inp.max_remediations} remediations per sweep"
            if len(cursor.held) >= HELD and cursor.started + HELD < inp.max_remediations:
                why = f"more than {HELD} nodes to remediate at once: left to the next sweep"
            self._record(self._entry(candidate, "dry-run" if inp.dry_run else "deferred", why))

    async def _start_decided(self) -> None:
        """Start (or refuse) the held remediations of every cluster whose nodes are all decided: all given out to
        slices, none of those still running."""
        cursor, inp = self._cursor, self._inp
        running = {r.cluster for r in self._running.values()}
        for cluster in inp.clusters[:cursor.cluster]:
            found = [c for c in cursor.held if c.cluster == cluster]
            if not found or cluster in running:
                continue
            cursor.held = [c for c in cursor.held if c.cluster != cluster]
            sweep = self._cluster(cluster)
            sweep.refused = too_few_healthy(sweep.healthy, sweep.healthy + sweep.not_healthy,
                                            inp.min_healthy) or await self._breaker_tripped(cluster)  # fmt: skip
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
            return f"the circuit breaker of {cluster} could not be read ({_cause(err)}): no remediation, to be safe"
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
                                   label_keys=inp.checks.label_keys()),
                **READ_CALL, endpoint=kubernetes_api(part.cluster),
                summary=f"read {len(part.nodes)} nodes of {part.cluster}")  # fmt: skip
        except (ActivityError, ApplicationError) as err:
            sweep.error = _cause(err)
            self._enter("failed", sweep.error)
            return self._result
        sweep.vanished = len(read.missing)
        dcgm: dict[str, list[GpuFault]] | None = None
        if not inp.checks.dcgm.enabled:
            sweep.dcgm = "not used: checks.dcgm.enabled is false"
        elif workflow.patched(DCGM_PATCH):
            dcgm = await self._dcgm_faults(part, sweep)
        self._enter("probing", f"{len(read.nodes)} nodes of {part.cluster}")
        found = await self._look_all(part.cluster, read.nodes, facts, sweep, together=True, dcgm=dcgm)
        self._result.found = [Candidate(cluster=c, decision=d, facts=f) for c, d, f in found]
        self._enter("completed", f"{sweep.healthy} healthy, {sweep.not_healthy} not, {len(found)} to remediate")
        return self._result

    async def _dcgm_faults(self, part: SweepSlice, sweep: ClusterSweep) -> dict[str, list[GpuFault]] | None:
        """The slice's GPU fault series by node, in one query; None (and `sweep.dcgm` says why) when not known."""
        checks = self._inp.checks.dcgm
        query = DcgmFaultsQuery(cluster=part.cluster, nodes=part.nodes, node_label=checks.node_label,
                                cluster_label=checks.cluster_label, metrics=checks.metrics())  # fmt: skip
        try:
            seen: DcgmFaults = await workflow.execute_activity_method(
                PrometheusActivities.dcgm_faults, query, **DCGM_CALL, priority=priorities.remediation(part.cluster),
                summary=f"GPU faults of {len(part.nodes)} nodes from Prometheus")  # fmt: skip
        except ActivityError as err:
            sweep.dcgm = f"not read: {_cause(err)}"[:500]
            return None
        if not seen.configured:
            sweep.dcgm = "not used: the worker has no MILLWRIGHT_PROMETHEUS_URL"
            return None
        sweep.gpu_faults = len(seen.faults) + seen.truncated
        sweep.dcgm = f"read from {seen.url}" + (f"; {seen.truncated} fault series past the first {len(seen.faults)} "
                                                f"not used" if seen.truncated else "")  # fmt: skip
        by_node: dict[str, list[GpuFault]] = {n: [] for n in part.nodes}
        for fault in seen.faults:
            by_node[fault.node].append(fault)
        return by_node

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

    # ------------------------------------------------------------ looking at nodes

    async def _look_all(self, cluster: str, nodes: list[NodeHealth], facts: dict[str, DeviceFacts],
                        sweep: ClusterSweep, *, together: bool,
                        dcgm: dict[str, list[GpuFault]] | None = None) -> list[tuple[str, NodeDecision, DeviceFacts]]:
        """Decide every node, probing its host agent and BMC (`together`: both at once) where the node object
        and its GPU fault series (`dcgm`, None: not read) alone do not settle it; counts into `sweep`; the nodes
        to remediate."""
        inp = self._inp
        slots = asyncio.Semaphore(max(1, inp.concurrency // inp.slices_at_once) if together else inp.concurrency)
        now = workflow.now()

        async def look(node: NodeHealth) -> tuple[str, NodeDecision, DeviceFacts]:
            node_facts = facts.get(node.name) or DeviceFacts()
            if node.name in inp.bmcs:
                node_facts = node_facts.model_copy(update={"bmc": inp.bmcs[node.name]})
            faults = dcgm.get(node.name, []) if dcgm is not None else None
            first = decide(cluster, node, inp.checks, now, cooldown=inp.cooldown, dcgm=faults)
            if first.action == "skip":  # quarantined or someone else's: no probe changes that
                return cluster, first, node_facts
            async with slots:
                agent_probe = self._probe_agent(node.name, node_facts) if inp.checks.host_agent else _nothing()
                bmc_probe = self._probe_bmc(node_facts.bmc) if inp.checks.bmc else _nothing()
                if together:
                    agent, bmc = await asyncio.gather(agent_probe, bmc_probe)
                else:
                    agent, bmc = await agent_probe, await bmc_probe
            if agent is not None and agent.status in ("unavailable", "error"):
                sweep.agents_unavailable += 1
            if inp.checks.bmc and (bmc is None or bmc.status != "ok"):
                sweep.bmc_unknown += 1
            return cluster, decide(cluster, node, inp.checks, now, agent=agent, bmc=bmc, cooldown=inp.cooldown,
                                   dcgm=faults), node_facts

        looked = await asyncio.gather(*(look(n) for n in nodes))
        for _, decision, _ in looked:
            if decision.action == "healthy":
                sweep.healthy += 1
            else:
                sweep.not_healthy += 1
                sweep.unhealthy.append(decision)
        return [x for x in looked if x[1].action == "remediate"]

    async def _probe_agent(self, node: str, facts: DeviceFacts) -> AgentObservation:
        inp = self._inp
        check = GpuCheckRequest(expected_count=facts.gpus if facts.gpus is not None else inp.remediation.expected_gpus,
                                expected_model=facts.gpu_model or inp.remediation.gpu_model,
                                report_unavailable=True)  # fmt: skip
        try:
            result: GpuCheckResult = await workflow.execute_activity_method(
                HostAgentActivities.host_gpu_check, check, task_queue=host_task_queue(node),
                schedule_to_start_timeout=inp.agent_timeout, start_to_close_timeout=timedelta(minutes=2),
                retry_policy=RetryPolicy(maximum_attempts=2), priority=priorities.remediation(inp.clusters[0]),
                summary=f"GPU check on {node}")  # fmt: skip
        except ActivityError as err:
            if isinstance(err.cause, TimeoutError) and err.cause.type == TimeoutType.SCHEDULE_TO_START:
                return AgentObservation(status="unavailable", detail=f"no host agent within {inp.agent_timeout}")
            return AgentObservation(status="error", detail=_cause(err)[:300])
        failed = [_finding(f) for f in result.findings if f.severity == "fail"]
        return AgentObservation(status="findings" if failed else "ok", findings=failed)

    async def _probe_bmc(self, bmc: BmcRef | None) -> BmcObservation | None:
        if bmc is None:
            return None
        try:
            seen: RedfishHealth = await workflow.execute_activity_method(
                RedfishActivities.redfish_health, bmc, start_to_close_timeout=timedelta(seconds=30),
                schedule_to_close_timeout=timedelta(minutes=2), retry_policy=BMC_RETRY,
                priority=priorities.remediation(self._inp.clusters[0]), summary=f"BMC health {bmc.url}")  # fmt: skip
        except ActivityError as err:
            return BmcObservation(status="unavailable", detail=_cause(err)[:300])
        return BmcObservation(**seen.model_dump())

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
                    checks=inp.checks, bmc=facts.bmc, **{**settings, "netbox": settings["netbox"] or inp.netbox})  # fmt: skip
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
    def _entry(candidate: Candidate, status: str, detail: str = "") -> StartedRemediation:
        node = candidate.decision.node
        return StartedRemediation(cluster=candidate.cluster, node=node, reasons=candidate.decision.reasons,
                                  workflow_id=remediation_workflow_id(candidate.cluster, node), status=status,
                                  detail=detail)  # fmt: skip

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
                found += [Candidate(cluster=c, decision=d, facts=f) for c, d, f in await self._read_whole(cluster, sweep)]
            except (ActivityError, ApplicationError) as err:
                sweep.error = _cause(err)
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
        return await self._look_all(cluster, nodes, facts, sweep, together=False)

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
        by = {s: r.remediation_counts.get(s, 0) for s in ("started", "already-running", "deferred", "refused")}
        line = (f"{nodes} nodes, {not_healthy} not healthy; started {by['started']}, already running "
                f"{by['already-running']}, deferred {by['deferred']}")  # fmt: skip
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


async def _nothing() -> None:
    return None


def _outcome_error(outcome: RunOutcome) -> str:
    why = outcome.causes[-1].message if outcome.causes else "no reason given"
    return f"{outcome.status}: {why}"
