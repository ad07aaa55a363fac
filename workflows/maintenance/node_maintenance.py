"""NodeMaintenance: take one node out of service safely, the way `kubectl drain` does.

cordon (ownership recorded on the node) → wait for protected pods to finish →
evict through the eviction API (a PodDisruptionBudget refusal is a visible wait
state, never an error) → wait until the evicted pods are gone → optionally uncordon,
never removing a cordon someone else placed; with `validation`, only once the node passes the validation gate
(workflows/validation/gate.py), else it stays cordoned and the run ends `validation-failed`.

Every step is an idempotent activity and the plan lives in workflow state, so a
worker killed at any point resumes without repeating a cordon or an eviction.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import SearchAttributePair
from temporalio.exceptions import ActivityError, ApplicationError

from activities.kube.activities import KubeActivities
from activities.kube.models import CordonRequest, DrainSettings, NodeRef, PodQuery, SkippedPod
from activities.kube.validators import validate_label_selector, validate_object_name, validate_positive_duration
from activities.models import StrictModel
from workflows.budget.budget import Budget
from workflows.budget.leases import LEASE_PATCH, SIGNAL_PATCH, Lease, acquire_lease, release_lease
from workflows.common import priorities
from workflows.common import search_attributes as sa
from workflows.common.base import Progress, WorkflowInput, publish_phase
from workflows.common.call_options import API_CALL
from workflows.common.deadlines import Deadline
from workflows.common.endpoints import Endpoints, RetryTimeout, kubernetes_api, with_waits
from workflows.common.patches import decide_early
from workflows.maintenance.drain import Drain, DrainCost, DrainProgress
from workflows.validation.defaults import validation_for
from workflows.validation.gate import validate_node
from workflows.validation.models import ValidationResult, ValidationSettings

# The validation gate before the uncordon: a retired patch (docs/patch-policy.md), recorded deprecated.
VALIDATION = "node-maintenance-validation"
# workflow.patched() id of the cluster's validation default, read when the input has no `validation`.
VALIDATION_DEFAULT = "node-maintenance-validation-default"
# workflow.patched() id: `protected_pods_timeout` is a timer (workflows/common/deadlines.py), not the clock.
PROTECTED_PODS_TIMER = "maintenance-protected-pods-timer"

Phase = Literal[
    "starting",
    "waiting-for-budget",
    "cordoning",
    "waiting-for-protected-pods",
    "draining",
    "waiting-for-pods-to-terminate",
    "validating",
    "uncordoning",
    "completed",
    "aborted",
    "failed",
    "validation-failed",
]
FINISHED = ("completed", "aborted", "failed", "validation-failed")


class NodeMaintenanceInput(WorkflowInput, RetryTimeout):
    """Drain one node of one cluster, for a stated reason."""

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    node: str = Field(description="Node name.")
    reason: str = Field(min_length=1, max_length=1024, description="Why; recorded on the node.")
    drain: DrainSettings = Field(default_factory=DrainSettings)
    protected_pod_selector: str | None = Field(
        None,
        description="Pods on the node matching this label selector are waited for, not evicted, "
        "until they finish (e.g. a training job's checkpoint).",
    )
    protected_pods_timeout: timedelta = Field(
        timedelta(hours=2), description="Give up waiting for protected pods after this long."
    )
    protected_pods_poll_interval: timedelta = Field(
        timedelta(seconds=10), description="How often to look whether the protected pods have finished."
    )
    uncordon_after: bool = Field(False, description="Uncordon when the drain is done (a cordon we placed only).")
    disruption_budget: Budget | None = Field(
        None,
        description="This run's own budget, inside the cluster's (which only an operator sets; 10% of its nodes until "
        "then). The node is taken out only when the cluster's budget allows, counting every node out of service.",
    )

    _names = field_validator("cluster", "node")(validate_object_name)
    _selector = field_validator("protected_pod_selector")(validate_label_selector)

    validation: ValidationSettings | None = Field(
        None, description="Checks the node must pass before the uncordon (docs/validation.md); needs uncordon_after."
    )

    _durations = field_validator("protected_pods_timeout", "protected_pods_poll_interval")(validate_positive_duration)

    @model_validator(mode="after")
    def _validation_gates_the_uncordon(self) -> NodeMaintenanceInput:
        if self.validation is not None and self.validation.enabled and not self.uncordon_after:
            raise ValueError("validation: it gates the uncordon; set uncordon_after: true (or leave validation out)")
        return self

    def workflow_id(self) -> str:
        return f"node-maintenance/{self.cluster}/{self.node}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster), SearchAttributePair(sa.NODE, self.node)]


class NodeMaintenanceStatus(DrainProgress):
    phase: Phase = "starting"
    cordoned_by_us: bool = False
    cordon_holder: str | None = None
    protected_pods: list[str] = Field(default_factory=list)
    uncordoned: bool = False
    lease: str | None = Field(None, description="The disruption budget lease held for the node.")
    validation: ValidationResult | None = None
    note: str = ""


class NodeMaintenanceResult(DrainCost):
    cluster: str
    node: str
    outcome: Literal["completed", "aborted", "validation-failed"]
    cordoned_by_us: bool
    cordon_holder: str | None = None
    evicted: list[str]
    skipped: list[SkippedPod]
    uncordoned: bool
    validation: ValidationResult | None = Field(None, description="The validation gate's verdict, when it ran.")
    note: str = ""


class AbortRequest(StrictModel):
    reason: str = Field(min_length=1)
    uncordon: bool = Field(True, description="Remove our cordon when aborting (never someone else's).")


class SkipWaitRequest(StrictModel):
    reason: str = Field(min_length=1)


@workflow.defn
class NodeMaintenance:
    @workflow.init
    def __init__(self, inp: NodeMaintenanceInput) -> None:
        self._inp = inp
        self._status = NodeMaintenanceStatus()
        self._abort: AbortRequest | None = None
        self._skip_wait: SkipWaitRequest | None = None
        self._calls = Endpoints(inp.retry_timeout, priority=priorities.OPERATOR)

    # ------------------------------------------------------------ operator controls

    @workflow.query(description="Full state: phase, pods evicted, evictions blocked and by which budget.")
    def status(self) -> NodeMaintenanceStatus:
        return self._status

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        s = self._status
        return Progress(
            phase=s.phase,
            done=len(s.evicted),
            total=s.to_evict,
            details=self._summary(),
            finished=s.phase in FINISHED,
            waiting=self._calls.waiting(),
        )

    @workflow.update(description="Stop the maintenance: no further evictions; optionally remove our cordon.")
    async def abort(self, req: AbortRequest) -> NodeMaintenanceStatus:
        self._abort = req
        self._set_details()
        return self._status

    @abort.validator
    def _validate_abort(self, req: AbortRequest) -> None:
        if self._abort is not None:
            raise ValueError(f"already aborting: {self._abort.reason}")
        if self._status.phase in ("validating", "uncordoning", *FINISHED):
            raise ValueError(f"nothing to abort: the maintenance is {self._status.phase}")

    @workflow.update(description="Stop waiting for protected pods and drain now.")
    async def skip_wait(self, req: SkipWaitRequest) -> NodeMaintenanceStatus:
        self._skip_wait = req
        return self._status

    @skip_wait.validator
    def _validate_skip_wait(self, req: SkipWaitRequest) -> None:
        if self._status.phase not in ("starting", "waiting-for-budget", "cordoning", "waiting-for-protected-pods"):
            raise ValueError(f"no wait to skip: the maintenance is {self._status.phase}")

    # ------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: NodeMaintenanceInput) -> NodeMaintenanceResult:
        owner = workflow.info().workflow_id
        # Runs started from the UI may lack these; the query by node must still find them.
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster), sa.NODE.value_set(inp.node)])
        self._enter("starting")
        cordon = CordonRequest(cluster=inp.cluster, node=inp.node, owner=owner, reason=inp.reason)
        try:
            await self._calls.execute(
                KubeActivities.inspect_node,
                NodeRef(cluster=inp.cluster, node=inp.node),
                **API_CALL,
                endpoint=kubernetes_api(inp.cluster),
                summary=f"inspect node {inp.node}",
            )
            # Before the node is touched: a bad default fails the run here. It gates the uncordon only. The lease
            # comes right after the default's local activity: its patches are decided before it.
            decide_early(LEASE_PATCH, SIGNAL_PATCH)
            validation = await validation_for(inp.cluster, inp.validation, VALIDATION_DEFAULT) \
                if inp.uncordon_after else inp.validation  # fmt: skip
            if workflow.patched(LEASE_PATCH) and not await self._lease(inp):
                why = self._abort.reason if self._abort else ""
                return await self._finish(
                    "aborted", cordon, False, f"aborted while waiting for the disruption budget: {why}"
                )
            self._enter("cordoning")
            held = await self._calls.execute(
                KubeActivities.cordon_node,
                cordon,
                **API_CALL,
                endpoint=kubernetes_api(inp.cluster),
                summary=f"cordon {inp.node}",
            )
            self._status.cordoned_by_us = held.owned
            self._status.cordon_holder = held.holder
            if inp.protected_pod_selector and not self._stopping():
                await self._wait_for_protected_pods(inp)
            if not self._stopping():
                await self._drain(inp)
        except (ActivityError, ApplicationError) as err:
            # The node stays cordoned: a half-drained node must not take new work.
            cause = err.cause if isinstance(err, ActivityError) and err.cause else err
            self._status.note = str(cause)
            self._enter("failed")
            raise
        if self._abort is not None:
            return await self._finish("aborted", cordon, self._abort.uncordon, f"aborted: {self._abort.reason}")
        if validation is not None and validation.enabled and inp.uncordon_after and self._status.cordoned_by_us:
            workflow.deprecate_patch(VALIDATION)
            self._enter("validating")
            verdict = await validate_node(inp.cluster, inp.node, validation, by=owner)
            self._status.validation = verdict
            if not verdict.passed:  # left cordoned, its lease kept: it must not take work until someone looks
                return await self._finish("validation-failed", cordon, False, f"validation failed: {verdict.reason}")
        return await self._finish("completed", cordon, inp.uncordon_after, "")

    async def _finish(
        self, outcome: Literal["completed", "aborted", "validation-failed"], cordon: CordonRequest, uncordon: bool,
        note: str,
    ) -> NodeMaintenanceResult:  # fmt: skip
        s = self._status
        if uncordon and s.cordoned_by_us:
            self._enter("uncordoning")
            done = await self._calls.execute(
                KubeActivities.uncordon_node,
                cordon,
                **API_CALL,
                endpoint=kubernetes_api(cordon.cluster),
                summary=f"uncordon {cordon.node}",
            )
            s.uncordoned = done.uncordoned
            note = "; ".join(n for n in (note, done.note) if n)
            if s.lease is not None:  # back in service: the lease goes back (a node left cordoned keeps it)
                await release_lease(cordon.cluster, cordon.node, reason="uncordoned")
                s.lease = None
        elif uncordon and not s.cordoned_by_us:
            note = "; ".join(n for n in (note, f"cordon held by {s.cordon_holder}; left in place") if n)
        s.note = note
        self._enter(outcome)
        return NodeMaintenanceResult(
            cluster=cordon.cluster,
            node=cordon.node,
            outcome=outcome,
            cordoned_by_us=s.cordoned_by_us,
            cordon_holder=s.cordon_holder,
            evicted=s.evicted,
            skipped=s.skipped,
            uncordoned=s.uncordoned,
            validation=s.validation,
            note=note,
            **s.cost().model_dump(),
        )

    async def _lease(self, inp: NodeMaintenanceInput) -> Lease | None:
        """Wait for the cluster's disruption budget to let the node out; None when aborted meanwhile."""

        def waiting(lease: Lease) -> None:
            self._status.note = f"{lease.id}: queued #{lease.position} in the disruption budget; {lease.note}"
            self._enter("waiting-for-budget")

        lease = await acquire_lease(inp.cluster, inp.node, reason=inp.reason, budget=inp.disruption_budget,
                                    cancelled=self._stopping, waiting=waiting)  # fmt: skip
        self._status.lease, self._status.note = (lease.id if lease else None), ""
        return lease

    async def _wait_for_protected_pods(self, inp: NodeMaintenanceInput) -> None:
        self._enter("waiting-for-protected-pods")
        started = workflow.now()
        deadline = started + inp.protected_pods_timeout
        timer: Deadline | None = None  # PROTECTED_PODS_TIMER: started once a look finds pods (none found: no event)
        query = PodQuery(cluster=inp.cluster, node=inp.node, label_selector=inp.protected_pod_selector or "")
        while not self._stopping() and self._skip_wait is None:
            pods = await self._calls.execute(
                KubeActivities.list_unfinished_pods,
                query,
                **API_CALL,
                endpoint=kubernetes_api(inp.cluster),
                summary="list protected pods",
            )
            self._status.protected_pods = [str(p) for p in pods]
            self._set_details()
            if not pods:
                if timer is not None:
                    timer.cancel()
                return
            if timer is None and workflow.patched(PROTECTED_PODS_TIMER):  # decided after the listing's activity
                timer = Deadline(inp.protected_pods_timeout, "protected pods time out", since=started)
            if timer is not None:
                if timer.passed:
                    raise self._protected_pods_timeout(inp)
                await timer.wait(lambda: self._stopping() or self._skip_wait is not None,
                                 at_most=inp.protected_pods_poll_interval,
                                 summary="protected pods still running")  # fmt: skip
                continue
            remaining = deadline - workflow.now()
            if remaining <= timedelta(0):
                raise self._protected_pods_timeout(inp)
            with contextlib.suppress(asyncio.TimeoutError):
                await workflow.wait_condition(
                    lambda: self._stopping() or self._skip_wait is not None,
                    timeout=min(inp.protected_pods_poll_interval, remaining),
                    timeout_summary="protected pods still running",
                )
        if timer is not None:
            timer.cancel()
        self._status.protected_pods = []

    def _protected_pods_timeout(self, inp: NodeMaintenanceInput) -> ApplicationError:
        return ApplicationError(
            f"protected pods still running on {inp.node} after {inp.protected_pods_timeout}: "
            + ", ".join(self._status.protected_pods),
            type="ProtectedPodsTimeout",
            non_retryable=True,
        )

    async def _drain(self, inp: NodeMaintenanceInput) -> None:
        self._enter("draining")
        await Drain(
            inp.cluster,
            inp.node,
            inp.drain,
            self._status,
            priority=priorities.OPERATOR,
            stopping=self._stopping,
            changed=self._set_details,
            terminating=lambda: self._enter("waiting-for-pods-to-terminate"),
        ).run()

    # ------------------------------------------------------------ visibility

    def _stopping(self) -> bool:
        return self._abort is not None

    def _enter(self, phase: Phase) -> None:
        self._status.phase = phase
        publish_phase(phase)
        self._set_details()

    def _summary(self) -> str:
        s = self._status
        lines = [f"**{s.phase}** node `{self._inp.node}` in `{self._inp.cluster}`"]
        if s.cordon_holder:
            lines.append(f"cordon held by {s.cordon_holder}")
        if s.protected_pods:
            lines.append(f"waiting for {len(s.protected_pods)} protected pods: {', '.join(s.protected_pods[:5])}")
        if s.to_evict:
            lines.append(f"{len(s.evicted)}/{s.to_evict} pods evicted")
        if s.gangs_interrupted:
            lines.append(
                f"{s.gangs_interrupted} gangs of GPU work interrupted, {s.gpu_hours_at_risk} GPU-hours at risk"
            )
        for b in list(s.blocked.values())[:5]:
            lines.append(f"blocked: {b.pod} by {b.budget or 'the API'} ({b.attempts} tries): {b.message}")
        if self._abort:
            lines.append(f"aborting: {self._abort.reason}")
        if s.note:
            lines.append(s.note)
        return "\n\n".join(lines)

    def _set_details(self) -> None:
        workflow.set_current_details(with_waits(self._summary(), self._calls.waiting()))
