"""Draining a node, as workflow code shared by every workflow that takes nodes out of service.

The plan (which pods) is fixed by one activity; each pod is then evicted on its own,
a PodDisruptionBudget refusal being a wait state with the blocking budget recorded in
the caller's progress, until the drain deadline; finally every planned pod must be gone,
as a fresh read shows it (missing, or a new UID), whatever its eviction reported: the
drain is done only when that wait says so. Every call is bounded by the drain's deadline, which a timer decides
once an eviction was refused (`DEADLINE_TIMER`; workflows/common/deadlines.py): two history events for a drain that
waited on a refusal, none for one that did not.
While an eviction is refused, or a pod outlives its grace period, the node's `DrainBlocked` condition says so
(the eviction and the wait write it: activities/kube/), and it goes False once the drain progresses.

What it cost: the plan carries the gangs of GPU work its pods belong to (activities/kube/gang_reads.py); each gang
not already below its minimum whose pod an eviction here took is interrupted, once, and its GPU-hours at risk are
its GPUs x the time since it started, at the drain's start, capped by the drain's `checkpoint_interval`
(activities/kube/topology.py `gpu_hours_at_risk`). Both are in the caller's progress and counted as metrics
(docs/metrics.md), by cluster and workflow type.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta

from pydantic import Field
from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

from activities.kube.activities import KubeActivities
from activities.kube.models import (
    DrainPlan,
    DrainPlanRequest,
    DrainSettings,
    EvictRequest,
    PodRef,
    SkippedPod,
    WaitPodsGoneRequest,
)
from activities.kube.topology import Gang, gpu_hours_at_risk
from activities.models import StrictModel
from workflows.common.call_options import API_CALL, API_RETRY
from workflows.common.deadlines import Deadline
from workflows.maintenance.gang_drains import GangDrains

EVICTION_CONCURRENCY = 25
MAX_BLOCKED_BACKOFF = timedelta(minutes=1)
# The final wait covers every pod of the plan, never trusting a "gone" from an eviction's answer: a retired patch
# (docs/patch-policy.md), recorded deprecated by the callers whose runs asked it.
WAIT_FOR_EVERY_PLANNED_POD = "drain-waits-for-every-planned-pod"
# workflow.patched() id: the deadline is a timer (workflows/common/deadlines.py), not the clock of the task that looks.
# Decided where the first eviction is refused (after that activity), or where the clock alone would end the drain.
DEADLINE_TIMER = "drain-deadline-timer"
GANGS_INTERRUPTED = "millwright_gangs_interrupted_total"
GPU_HOURS_AT_RISK = "millwright_gpu_hours_at_risk"


class BlockedEviction(StrictModel):
    pod: str
    budget: str | None = None
    message: str = ""
    attempts: int = 0


class DrainCost(StrictModel):
    """What taking nodes out of service cost the GPU work on them: a node's drain, or a fleet run's nodes summed."""

    gangs_interrupted: int = Field(
        0, description="Gangs of GPU work whose pods a drain evicted and that were whole before: each restarts."
    )
    gpu_hours_at_risk: float = Field(
        0.0, description="Those gangs' GPUs x the time since each started, each capped by the checkpoint interval."
    )
    interrupted_gangs: dict[str, float] = Field(
        default_factory=dict,
        description="Each of them (`<kind>:<namespace>/<name>`) -> its GPU-hours at risk: a "
        "gang counts once per run, however many of its nodes are drained.",
    )

    def add(self, other: DrainCost) -> None:
        """Count `other`'s gangs in, those not counted yet (the first drain that interrupted a gang is its cost)."""
        for gang, hours in other.interrupted_gangs.items():
            self.interrupted_gangs.setdefault(gang, hours)
        self.gangs_interrupted = len(self.interrupted_gangs)
        self.gpu_hours_at_risk = round(sum(self.interrupted_gangs.values()), 3)

    def cost(self) -> DrainCost:
        return DrainCost(gangs_interrupted=self.gangs_interrupted, gpu_hours_at_risk=self.gpu_hours_at_risk,
                         interrupted_gangs=dict(self.interrupted_gangs))  # fmt: skip


class DrainProgress(DrainCost):
    to_evict: int = 0
    evicted: list[str] = Field(default_factory=list)
    skipped: list[SkippedPod] = Field(default_factory=list)
    blocked: dict[str, BlockedEviction] = Field(default_factory=dict)


class Drain:
    """One drain of one node; `progress` is the caller's to show in queries and details."""

    def __init__(
        self,
        cluster: str,
        node: str,
        settings: DrainSettings,
        progress: DrainProgress,
        *,
        stopping: Callable[[], bool],
        changed: Callable[[], None],
        terminating: Callable[[], None] = lambda: None,
        every_planned_pod: bool = False,
        priority: Priority = Priority.default,
        together: GangDrains | None = None,
    ) -> None:
        """`every_planned_pod`: the caller's runs all started after WAIT_FOR_EVERY_PLANNED_POD, so none records its
        marker (a marker and a search attribute per run). `priority`: every call's
        (workflows/common/priorities.py; the default: the workflow's own). `together`: the drains this one runs
        beside (workflows/maintenance/gang_drains.py): a gang on their nodes too is evicted with them."""
        self._cluster, self._node, self._settings, self._progress = cluster, node, settings, progress
        self._priority = priority
        self._stopping, self._changed, self._terminating = stopping, changed, terminating
        self._every_planned_pod = every_planned_pod
        self._together = together
        self._gangs: dict[str, Gang] = {}  # the plan's gangs that were whole: an eviction interrupts them
        self._pod_gangs: dict[str, str] = {}
        self._started = workflow.now()
        self._timed: bool | None = None  # DEADLINE_TIMER, once decided
        self._timers: dict[datetime, Deadline] = {}  # by deadline: the drain's, a gang's from when its nodes were ready
        # An eviction was refused (before a continue-as-new too): the node's DrainBlocked is cleared at the end.
        self._was_blocked = bool(progress.blocked)

    async def run(self, plan: DrainPlan | None = None) -> None:
        """Drain; raises a non-retryable DrainTimeout, or DrainBlocked from the plan. `plan`: the pods to evict as
        the caller listed them after the cordon (`start_node_update`); None: listed here."""
        deadline = workflow.now() + self._settings.timeout
        if plan is None:
            listed: DrainPlan = await workflow.execute_activity_method(
                KubeActivities.plan_drain,
                DrainPlanRequest(cluster=self._cluster, node=self._node, settings=self._settings),
                **API_CALL,
                priority=self._priority,
                summary=f"list pods on {self._node}",
            )
            plan = listed  # typed: the call's options spread from a dict leave its result untyped
        self._progress.to_evict = len(plan.evict)
        self._progress.skipped = plan.skipped
        self._gangs = {g.id: g for g in plan.gangs if not g.disrupted}
        self._pod_gangs, self._started = plan.pod_gangs, workflow.now()
        self._changed()
        slots = asyncio.Semaphore(EVICTION_CONCURRENCY)
        gangs = {g.id: g for g in plan.gangs}
        spread = self._together.spread(self._node, gangs.values()) if self._together is not None else set()
        held = None
        if self._together is not None and spread:  # the gangs other nodes run too: taken with them, once ready
            held = asyncio.ensure_future(self._together.together(self._node, [gangs[g] for g in sorted(spread)]))

        deadlines = [deadline]

        async def evict(pod: PodRef) -> None:
            until = deadline
            if held is not None and plan.pod_gangs.get(str(pod)) in spread:
                await held
                until = workflow.now() + self._settings.timeout  # the wait for the mates is not the drain's
                deadlines.append(until)
            async with slots:
                await self._evict_until_done(pod, until)

        await asyncio.gather(*(evict(p) for p in plan.evict))
        for timer in self._timers.values():  # a failed eviction leaves it running: the other pods' loops end by it
            timer.cancel()
        deadline = max(deadlines)
        # Defence in depth: a pod is off the node only once the wait's own fresh reads say so.
        if not self._every_planned_pod:
            workflow.deprecate_patch(WAIT_FOR_EVERY_PLANNED_POD)
        waited = plan.evict
        if not waited or self._stopping():
            return
        self._terminating()
        remaining = max(deadline - workflow.now(), timedelta(seconds=1))
        try:
            await workflow.execute_activity_method(
                KubeActivities.wait_pods_gone,
                WaitPodsGoneRequest(cluster=self._cluster, pods=waited, node=self._node, was_blocked=self._was_blocked),
                start_to_close_timeout=remaining,
                schedule_to_close_timeout=remaining,
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=API_RETRY,
                priority=self._priority,
                summary=f"wait for {len(waited)} pods to terminate",
            )
        except ActivityError as err:
            raise ApplicationError(
                f"drain of {self._node} timed out after {self._settings.timeout} waiting for evicted pods to terminate",
                type="DrainTimeout",
                non_retryable=True,
            ) from err

    def _interrupted(self, gang: Gang | None) -> None:
        """An eviction took a pod of `gang`: the gang is interrupted (once), at what cost."""
        progress = self._progress
        if gang is None or gang.id in progress.interrupted_gangs:
            return
        hours = gpu_hours_at_risk([gang], self._started, self._settings.checkpoint_interval)
        progress.add(DrainCost(interrupted_gangs={gang.id: hours}))
        labels = {"cluster": self._cluster, "workflow_type": workflow.info().workflow_type}
        meter = workflow.metric_meter()
        meter.create_counter(GANGS_INTERRUPTED, "Gangs of GPU work a drain interrupted").add(1, labels)
        meter.create_histogram_float(GPU_HOURS_AT_RISK, "GPU-hours at risk of each gang a drain interrupted: its "
                                     "GPUs x its run since it started, capped by the checkpoint interval",
                                     "h").record(hours, labels)  # fmt: skip

    async def _evict_until_done(self, pod: PodRef, deadline: datetime) -> None:
        """Evict one pod, waiting out PDB refusals."""
        key, progress, interval = str(pod), self._progress, self._settings.eviction_retry_interval
        attempts = 0
        while not self._stopping():
            if self._passed(deadline):
                blocked = progress.blocked.get(key)
                raise ApplicationError(
                    f"drain of {self._node} timed out after {self._settings.timeout}; {key} still blocked"
                    + (f" by {blocked.budget}: {blocked.message}" if blocked else ""),
                    type="DrainTimeout",
                    non_retryable=True,
                )
            try:
                outcome = await workflow.execute_activity_method(
                    KubeActivities.evict_pod,
                    EvictRequest(
                        cluster=self._cluster,
                        pod=pod,
                        grace_period_seconds=self._settings.grace_period_seconds,
                        node=self._node,
                        was_blocked=key in progress.blocked,
                    ),
                    **API_CALL,
                    # An API that keeps failing is retried until the drain's deadline, not beyond.
                    schedule_to_close_timeout=max(deadline - workflow.now(), API_CALL["start_to_close_timeout"]),
                    priority=self._priority,
                    summary=f"evict {key}",
                )
            except ActivityError as err:
                if not isinstance(err.cause, ActivityTimeout):
                    raise
                last = err.cause.cause or err.cause  # the last attempt's error, if it failed before timing out
                raise ApplicationError(
                    f"drain of {self._node} timed out after {self._settings.timeout} evicting {key}: {last}",
                    type="DrainTimeout",
                    non_retryable=True,
                ) from err
            attempts += 1
            if outcome.status != "blocked":
                progress.blocked.pop(key, None)
                progress.evicted.append(key)
                if outcome.status == "evicted":
                    self._interrupted(self._gangs.get(self._pod_gangs.get(key, "")))
                self._changed()
                return
            self._was_blocked = True
            progress.blocked[key] = BlockedEviction(
                pod=key, budget=outcome.budget, message=outcome.message, attempts=attempts
            )
            self._changed()
            # Back off from the configured interval to a minute: a budget blocked for
            # long must not flood the history with attempts.
            wait = max(interval, min(interval * 2 ** (attempts - 1), MAX_BLOCKED_BACKOFF))
            if outcome.retry_after_seconds:
                wait = max(wait, timedelta(seconds=outcome.retry_after_seconds))
            summary = f"eviction of {key} blocked by {outcome.budget or 'the API'}"
            if self._by_timer():
                await self._timer(deadline).wait(self._stopping, at_most=wait, summary=summary)
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await workflow.wait_condition(
                    self._stopping,
                    timeout=min(wait, max(deadline - workflow.now(), timedelta(seconds=1))),
                    timeout_summary=summary,
                )
        return None

    def _by_timer(self) -> bool:
        """DEADLINE_TIMER, decided the first time it matters: a drain nothing refused never asks it (no event)."""
        if self._timed is None:
            self._timed = workflow.patched(DEADLINE_TIMER)
        return self._timed

    def _timer(self, deadline: datetime) -> Deadline:
        """`deadline`'s timer, started at its first refused eviction: a drain nothing refused costs no event."""
        if deadline not in self._timers:
            self._timers[deadline] = Deadline(self._settings.timeout, f"drain of {self._node} times out",
                                              since=deadline - self._settings.timeout)  # fmt: skip
        return self._timers[deadline]

    def _passed(self, deadline: datetime) -> bool:
        """Whether an eviction due now is past `deadline`: its timer fired, once one runs. Before (nothing refused
        yet: a pod that waited for its slot), the clock: runs from before DEADLINE_TIMER time out by it, later
        ones try the eviction, itself bounded (`API_CALL`'s start-to-close at least)."""
        if deadline in self._timers:
            return self._timers[deadline].passed
        return workflow.now() >= deadline and not self._by_timer()
