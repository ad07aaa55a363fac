"""The campaign engine: one child run per cluster, the canary first, then waves, with soak, a failure threshold across
clusters, an approval after the canary and the operator's pause, resume and abort (issue #42).

`Campaign` holds the loop and the books; a campaign workflow (workflows/campaign/fleet_rollout.py,
fleet_gpu_partitioning.py, firmware_campaign.py) names the child it runs on each cluster in a `ClusterWork` and
inherits `CampaignControls` for the operator's updates and queries. A child runs on the campaign's own task queue (the
default of a child workflow) under its cluster's own disruption budget, which the child asks for itself.

History: a cluster costs its child's start (initiated, started) and end (3 events), and its share of the workflow
tasks that see them (3 events each, shared by the clusters of a wave whose starts or ends come together): 6 to 9
events per cluster, 2 more per pause, resume or abort it is sent, plus 2 per soak timer and one per phase published.
200 clusters (the input's limit) stay under 2,000 events, far from Temporal's 10,240-event warning and 51,200 limit,
so a campaign never continues as new.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic
from temporalio import workflow
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ChildWorkflowError, WorkflowAlreadyStartedError

from workflows.campaign.models import (
    ApproveRequest,
    CampaignOutcome,
    CampaignResult,
    CampaignStatus,
    ClusterOutcome,
    ClusterState,
    WavePlan,
)
from workflows.common.base import Phases, Progress, WorkflowInput
from workflows.rollout.models import ReasonRequest

FINISHED = ("completed", "failed", "aborted")


@dataclass(frozen=True)
class ClusterWork:
    """The child a campaign runs on each cluster: its workflow type, its input for a cluster (whose `workflow_id`
    and `search_attributes` the child is started with, as the CLI would start it), how its result reads, and the
    signals that pause, resume and abort it (workflows/rollout/fleet_controls.py)."""

    workflow: str
    input: Callable[[str], WorkflowInput]
    read: Callable[[Any], tuple[ClusterState, dict[str, int], str]]  # its result (JSON) -> state, counts, why
    pause_signal: str = "pause_from_campaign"
    resume_signal: str = "resume_from_campaign"
    abort_signal: str = "abort_from_campaign"


def fleet_run(
    workflow: str, noun: str, result: type[pydantic.BaseModel], input: Callable[[str], WorkflowInput]
) -> ClusterWork:
    """A child on the fleet engine (workflows/rollout/compartments.py: a Rollout, a GpuPartitioning), whose `result`
    has its `outcome`, node `counts` and `problems`: its cluster fails when a node of it ends erroring, the change not
    landed on every node it targets."""

    def read(value: Any) -> tuple[ClusterState, dict[str, int], str]:
        res: Any = result.model_validate(value)
        if res.outcome == "aborted":
            return "aborted", res.counts, f"the {noun} was aborted"
        if res.counts.get("erroring"):
            shown = "; ".join(f"{n}: {why}" for n, why in sorted(res.problems.items())[:3])
            return "failed", res.counts, f"{res.counts['erroring']} nodes erroring ({shown})"
        return "completed", res.counts, ""

    return ClusterWork(workflow=workflow, input=input, read=read)


class Campaign:
    """The clusters of one campaign, wave by wave; what it waits for; every cluster's state."""

    def __init__(self, clusters: list[str], plan: WavePlan, work: ClusterWork) -> None:
        self.plan, self.work = plan, work
        self.waves = plan.waves(clusters)
        self.clusters = {c: ClusterOutcome(wave=i) for i, wave in enumerate(self.waves) for c in wave}
        self.wave = -1
        self.paused: str | None = None
        self.aborted: str | None = None
        self.approved_by: str | None = None
        self.awaiting_approval = False
        self.outcome: CampaignOutcome | None = None
        self._soak_until: str | None = None
        self._running: dict[str, workflow.ChildWorkflowHandle] = {}
        self._phases = Phases(finished=FINISHED)

    async def result(self, name: str) -> CampaignResult:
        """Every wave run, the controls under way answered: how every cluster ended."""
        outcome = await self.run()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return CampaignResult(name=name, outcome=outcome, clusters=self.clusters, waves=self.waves)

    async def run(self) -> CampaignOutcome:
        for number, wave in enumerate(self.waves):
            if number > 0:
                await self._soak()
                if number == 1 and self.plan.approve_after_canary:
                    await self._approval()
            if self._stopping():
                break
            self.wave = number
            self.show()
            await asyncio.gather(*(self._cluster(c) for c in wave))
        why = f"aborted: {self.aborted}" if self.aborted else f"more than {self.plan.max_failed_clusters} failed"
        for outcome in self.clusters.values():
            if outcome.state == "pending":
                outcome.state, outcome.error = "skipped", why
        self.outcome = "aborted" if self.aborted else "failed" if self._too_many_failed() else "completed"
        self.show()
        return self.outcome

    async def _cluster(self, cluster: str) -> None:
        """Start the cluster's child once not paused (never once stopping), and wait for it to end."""
        await workflow.wait_condition(lambda: self.paused is None or self._stopping())
        if self._stopping():
            return
        w, outcome = self.work, self.clusters[cluster]
        inp = w.input(cluster)
        outcome.state, outcome.workflow_id, outcome.started = "running", inp.workflow_id(), workflow.now()
        self.show()
        try:
            handle = await workflow.start_child_workflow(
                w.workflow,
                inp,
                id=outcome.workflow_id,
                search_attributes=TypedSearchAttributes(inp.search_attributes()),
                # The child outlives a terminated campaign: each cluster's run stays controllable on its own, where
                # terminating it could stop a node mid-interrupt.
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=f"{cluster}: wave {outcome.wave} of campaign {workflow.info().workflow_id}",
            )
        except WorkflowAlreadyStartedError:
            self._ended(outcome, "failed", {}, f"a run with ID {outcome.workflow_id} is already running")
            return
        self._running[cluster] = handle
        if self.aborted is not None:  # sent while it was starting
            await handle.signal(w.abort_signal, ReasonRequest(reason=self.aborted))
        elif self.paused is not None:
            await handle.signal(w.pause_signal, ReasonRequest(reason=self.paused))
        try:
            state, counts, error = w.read(await handle)
        except ChildWorkflowError as err:
            state, counts, error = "failed", {}, str(err.cause or err)
        del self._running[cluster]
        self._ended(outcome, state, counts, error)

    def _ended(self, outcome: ClusterOutcome, state: ClusterState, counts: dict[str, int], error: str) -> None:
        outcome.state, outcome.counts, outcome.error, outcome.ended = state, counts, error, workflow.now()
        self.show()

    async def _soak(self) -> None:
        """A durable timer after a wave; an abort or the failure threshold ends it early."""
        if not self.plan.soak or self._stopping():
            return
        until = workflow.now() + self.plan.soak
        self._soak_until = f"{until:%Y-%m-%d %H:%M:%S} UTC"
        self.show()
        with contextlib.suppress(TimeoutError):  # the soak's end
            await workflow.wait_condition(self._stopping, timeout=self.plan.soak, timeout_summary="soak")
        self._soak_until = None
        self.show()

    async def _approval(self) -> None:
        self.awaiting_approval = True
        self.show()
        await workflow.wait_condition(lambda: self.approved_by is not None or self._stopping())
        self.awaiting_approval = False
        self.show()

    # ------------------------------------------------------------ the operator's controls

    async def pause(self, reason: str) -> None:
        self.paused = reason
        await self._signal_running(self.work.pause_signal, reason)

    async def resume(self, reason: str) -> None:
        self.paused = None
        await self._signal_running(self.work.resume_signal, reason)

    async def abort(self, reason: str) -> None:
        self.aborted = reason
        await self._signal_running(self.work.abort_signal, reason)

    def approve(self, approver: str) -> None:
        self.approved_by = approver

    def require_active(self) -> None:
        if self.outcome is not None:
            raise ValueError(f"the campaign has ended: {self.outcome}")
        if self.aborted is not None:
            raise ValueError(f"the campaign is aborting: {self.aborted}")

    async def _signal_running(self, signal: str, reason: str) -> None:
        for handle in list(self._running.values()):
            await handle.signal(signal, ReasonRequest(reason=reason))
        self.show()

    # ------------------------------------------------------------ state and visibility

    def _failed(self) -> int:
        """Clusters that did not take the change: failed, or aborted by someone else than the campaign."""
        return sum(
            o.state == "failed" or (o.state == "aborted" and self.aborted is None) for o in self.clusters.values()
        )

    def _too_many_failed(self) -> bool:
        return self._failed() > self.plan.max_failed_clusters

    def _stopping(self) -> bool:
        return self.aborted is not None or self._too_many_failed()

    def waiting_for(self) -> str:
        running = sorted(self._running)
        if self.outcome is not None:
            return ""
        if self.aborted is not None or self._too_many_failed():
            why = f"aborting: {self.aborted}" if self.aborted else f"more than {self.plan.max_failed_clusters} failed"
            return f"{why}; no cluster starts; waiting for {', '.join(running) or 'nothing'} to finish"
        if self.paused is not None:
            return f"paused ({self.paused}); running clusters hold: {', '.join(running) or 'none'}"
        if self.awaiting_approval:
            return "approval after the canary (millwright campaign approve)"
        if self._soak_until is not None:
            return f"soak until {self._soak_until}"
        if self.wave >= 0:
            return f"wave {self.wave} of {len(self.waves) - 1}: {', '.join(running) or 'starting'}"
        return ""

    def phase(self) -> str:
        if self.outcome is not None:
            return self.outcome
        for phase, now in (("aborting", self.aborted is not None), ("stopping", self._too_many_failed()),
                           ("paused", self.paused is not None), ("waiting-for-approval", self.awaiting_approval),
                           ("soaking", self._soak_until is not None), ("canary", self.wave == 0)):  # fmt: skip
            if now:
                return phase
        return "running" if self.wave > 0 else "starting"

    def status(self) -> CampaignStatus:
        return CampaignStatus(
            phase=self.phase(),
            waiting_for=self.waiting_for(),
            wave=self.wave,
            waves=self.waves,
            paused=self.paused,
            aborted=self.aborted,
            awaiting_approval=self.awaiting_approval,
            approved_by=self.approved_by,
            failed=self._failed(),
            max_failed_clusters=self.plan.max_failed_clusters,
            clusters=self.clusters,
        )

    def progress(self) -> Progress:
        return self._phases.progress

    def show(self) -> None:
        """The phase (search attribute, only when it changes: an event each), progress and current details: what it
        waits for, then every cluster that is not pending."""
        ended = sum(o.state not in ("pending", "running") for o in self.clusters.values())
        lines = [self.waiting_for()] + [
            f"{c}: {o.state}" + (f" ({o.error[:200]})" if o.error else "")
            for c, o in self.clusters.items()
            if o.state != "pending"
        ]
        pending = sum(o.state == "pending" for o in self.clusters.values())
        lines += [f"{pending} clusters pending"] if pending else []
        self._phases.enter(self.phase(), "\n".join(line for line in lines if line), ended, len(self.clusters))


class CampaignControls:
    """The operator's controls and queries of a campaign that holds its `Campaign` as `self._campaign`: updates
    with validators, named as the Rollout's (workflows/rollout/fleet_controls.py)."""

    _campaign: Campaign

    @workflow.query(description="Every cluster's state, what the campaign waits for.")
    def status(self) -> CampaignStatus:
        return self._campaign.status()

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._campaign.progress()

    @workflow.update(description="Start no new cluster; running clusters' runs pause too.")
    async def pause(self, req: ReasonRequest) -> CampaignStatus:
        await self._campaign.pause(req.reason)
        return self._campaign.status()

    @pause.validator
    def _validate_pause(self, req: ReasonRequest) -> None:
        self._campaign.require_active()
        if self._campaign.paused is not None:
            raise ValueError(f"already paused: {self._campaign.paused}")

    @workflow.update(description="Carry on after a pause; running clusters' runs resume too.")
    async def resume(self, req: ReasonRequest) -> CampaignStatus:
        await self._campaign.resume(req.reason)
        return self._campaign.status()

    @resume.validator
    def _validate_resume(self, req: ReasonRequest) -> None:
        self._campaign.require_active()
        if self._campaign.paused is None:
            raise ValueError("the campaign is not paused")

    @workflow.update(description="Start no new cluster; running clusters' runs abort (their nodes in flight finish).")
    async def abort(self, req: ReasonRequest) -> CampaignStatus:
        await self._campaign.abort(req.reason)
        return self._campaign.status()

    @abort.validator
    def _validate_abort(self, req: ReasonRequest) -> None:
        self._campaign.require_active()

    @workflow.update(description="Let the waves after the canary start.")
    async def approve(self, req: ApproveRequest) -> CampaignStatus:
        self._campaign.approve(req.approver)
        self._campaign.show()
        return self._campaign.status()

    @approve.validator
    def _validate_approve(self, req: ApproveRequest) -> None:
        self._campaign.require_active()
        if not self._campaign.awaiting_approval:
            raise ValueError("the campaign is not waiting for approval")
