"""Routing by site: with a site map (activities/sites.py), every call a workflow makes to a site's systems runs on
that site's task queue, where only that site's workers, with that site's credentials, take it.

A call goes to the site of the cluster its input names (`cluster`), else of the fabric (`fabric`), else of the BMC
(`bmc`, or the input itself being a BMC reference), else of the run's own input (the same fields, and a burn-in's
`server.bmc`). Calls this worker registers (NetBox, Prometheus, entities, notifications) and calls with a task
queue of their own (the host agents') are left as they are. A local activity of a site's system becomes a regular
activity on the site's queue: the central worker cannot reach the site.

A site with no worker taking calls, or a place in no site, is waited out visibly: each attempt is scheduled with a
pickup timeout (`PICKUP`, MILLWRIGHT_SITE_PICKUP_SECONDS); when it passes unanswered, the run's current details say
which site and queue wait, how many calls and since when, and the call is scheduled again with twice the pickup (up
to `MAX_PICKUP`), re-reading the map (a corrected map, with the worker restarted, takes effect). A waiting task stays
on its queue, so a worker that comes back takes it at once. When the pickups that passed reach the run's
`retry_timeout` (default 10 minutes) the call fails with the non-retryable `SiteUnavailable`: the timeouts in the
history decide, never the clock. Nothing here runs without a site map.

Event cost: a site's local activity becomes a regular one (+2 events, and a workflow task where the run would have
gone on in the same one); a call waiting out a cut-off site about 5 events per pickup: 30 s, 1, 2, 4 min and the
rest make 5 pickups, some 25 events, in the default 10 minutes.

Replay: the choice of queue is not part of Temporal's determinism check (an activity is matched by its ID and
type), so a changed map replays; turning a site map on or off changes which calls are local activities, so it is a
deployment change for new runs (docs/sites-and-campaigns.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import Priority, RawValue
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, TimeoutError, TimeoutType
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    StartActivityInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from activities.redfish import BmcRef
from activities.sites import SITE_WAIT, SiteMap, site_task_queue
from workflows.common.endpoints import DEFAULT_RETRY_TIMEOUT, human

# How long a site's call may wait on its queue before the run says so and schedules it again: long enough for a
# busy site's workers to take a batch's calls, short enough that a stalled site shows within a minute.
PICKUP = timedelta(seconds=30)
MAX_PICKUP = timedelta(minutes=5)  # the longest one pickup grows to (see _until_taken)
UNPLACED_QUEUE = "millwright-site-unplaced"  # where a call whose place is in no site waits: no worker polls it


def place_of(arg: Any) -> str | None:
    """What `arg` names that belongs to a site, as `kind:name` (cluster, fabric, bmc), or None."""
    for kind in ("cluster", "fabric"):
        value = getattr(arg, kind, None)
        if isinstance(value, str) and value:
            return f"{kind}:{value}"
    bmc = arg if isinstance(arg, BmcRef) else getattr(arg, "bmc", None)
    if bmc is None:
        bmc = getattr(getattr(arg, "server", None), "bmc", None)
    return f"bmc:{bmc.url}" if isinstance(bmc, BmcRef) else None


def site_of(sites: SiteMap, place: str) -> str | None:
    kind, _, name = place.partition(":")
    if kind == "bmc":
        return sites.site_of_bmc(name)
    if kind == "fabric":
        return sites.site_of_fabric(name)
    return sites.site_of_cluster(name)


class SiteRouting(Interceptor):
    """The worker's interceptor: `central` are the activities this worker runs itself; `pickup`: see PICKUP."""

    def __init__(self, sites: SiteMap, central: Iterable[str], pickup: timedelta = PICKUP) -> None:
        self.sites = sites
        self.central = frozenset(central)
        self.pickup = pickup

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        routing = self

        class Inbound(_RunInbound):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                self.outbound = _RunOutbound(outbound, routing)
                super().init(self.outbound)

        return Inbound


class _RunInbound(WorkflowInboundInterceptor):
    outbound: _RunOutbound

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        arg = input.args[0] if input.args else None
        self.outbound.run_place = place_of(arg)
        bound = getattr(arg, "retry_timeout", None)
        self.outbound.bound = bound if isinstance(bound, timedelta) else DEFAULT_RETRY_TIMEOUT
        return await super().execute_workflow(input)


class _RunOutbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, routing: SiteRouting) -> None:
        super().__init__(next)
        self.sites, self.central, self.pickup = routing.sites, routing.central, routing.pickup
        self.run_place: str | None = None
        self.bound = DEFAULT_RETRY_TIMEOUT
        self.waiting: dict[str, tuple[int, datetime]] = {}  # where calls wait -> how many, since when

    def _routed(self, activity: str, task_queue: str | None) -> bool:
        return task_queue is None and activity not in self.central

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle:
        if not self._routed(input.activity, input.task_queue):
            return super().start_activity(input)
        return self._call(input)

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle:
        if not self._routed(input.activity, None):
            return super().start_local_activity(input)
        shared = {f.name: getattr(input, f.name) for f in dataclasses.fields(StartActivityInput)
                  if hasattr(input, f.name)}  # fmt: skip
        return self._call(StartActivityInput(**{
            **shared, "task_queue": None, "heartbeat_timeout": None, "disable_eager_execution": False,
            "versioning_intent": None, "priority": Priority.default,
        }))  # fmt: skip

    def _call(self, input: StartActivityInput) -> Any:
        # An asyncio task stands for the activity handle: awaiting it gives the result, cancelling it cancels the
        # attempt in flight (the callers only await and cancel their handles).
        return asyncio.ensure_future(self._until_taken(input))

    def _queue(self, input: StartActivityInput) -> tuple[str, str]:
        place = place_of(input.args[0] if input.args else None) or self.run_place
        site = site_of(self.sites, place) if place else None
        if site is not None:
            return site_task_queue(site), f"site {site} (task queue {site_task_queue(site)})"
        what = place.replace(":", " ", 1) if place else "a call whose input names no cluster, fabric or BMC"
        return UNPLACED_QUEUE, f"{what}: in no site of the site map (MILLWRIGHT_SITE_MAP)"

    async def _until_taken(self, input: StartActivityInput) -> Any:
        waited = timedelta(0)  # the pickups that passed unanswered: history events, never the clock, decide
        pickup = self.pickup
        waiting: str | None = None
        try:
            while True:
                queue, where = self._queue(input)
                attempt = dataclasses.replace(input, task_queue=queue, schedule_to_start_timeout=pickup)
                try:
                    return await super().start_activity(attempt)
                except ActivityError as err:
                    if not _not_picked_up(err):
                        raise
                    unanswered = err
                waited += pickup
                if waited >= self.bound:
                    raise _gave_up(unanswered, where, waited, self.bound)
                if waiting != where:
                    self._unwait(waiting)
                    waiting = where
                    count, since = self.waiting.get(where, (0, workflow.now() - waited))
                    self.waiting[where] = (count + 1, since)
                    self._show()
                # Each pickup twice the last (a task still on the queue is taken the moment a worker polls): a batch
                # of calls waiting out a cut-off site adds a few events each, not one round per PICKUP.
                pickup = max(min(pickup * 2, MAX_PICKUP, self.bound - waited), timedelta(seconds=1))
        finally:
            self._unwait(waiting)

    def _unwait(self, where: str | None) -> None:
        if where is None:
            return
        count, since = self.waiting.pop(where, (1, workflow.now()))
        if count > 1:
            self.waiting[where] = (count - 1, since)
        self._show()

    def _show(self) -> None:
        kept = [
            part for part in workflow.get_current_details().split("\n\n") if part and not part.startswith(SITE_WAIT)
        ]
        lines = [f"{SITE_WAIT} {where}: {count} call(s) not taken by any worker since {since:%H:%M:%S}Z; waiting, up "
                 f"to retry_timeout ({human(self.bound)}) each" for where, (count, since) in sorted(self.waiting.items())]  # fmt: skip
        workflow.set_current_details("\n\n".join(kept + lines))


@activity.defn(dynamic=True)
async def site_call_misrouted(args: Sequence[RawValue]) -> None:
    """The central worker's guard with a site map: it never reaches a site's systems, so a site's call that came
    to it anyway (scheduled on the central queue, past the routing) fails at once, naming itself. Registered also
    because the SDK accepts a local activity only if the workflow's worker has it (or this dynamic one)."""
    raise ApplicationError(
        f"'{activity.info().activity_type}' reaches a site's systems but was scheduled on the central task queue "
        f"'{activity.info().task_queue}' (worker/site_routing.py routes every such call to its site)",
        type="SiteCallMisrouted", non_retryable=True,
    )  # fmt: skip


def _gave_up(err: ActivityError, where: str, waited: timedelta, bound: timedelta) -> ActivityError:
    """The call failed as any activity fails for good (its caller handles it so: a node errors, a burn-in aborts),
    its cause the non-retryable `SiteUnavailable` naming the site."""
    failed = ActivityError(
        "activity not taken by its site", scheduled_event_id=err.scheduled_event_id,
        started_event_id=err.started_event_id, identity=err.identity, activity_type=err.activity_type,
        activity_id=err.activity_id, retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )  # fmt: skip
    failed.__cause__ = ApplicationError(
        f"{where}: no worker took '{err.activity_type}' in {human(waited)}; gave up (retry_timeout {human(bound)})",
        {"site": where, "activity": err.activity_type}, type="SiteUnavailable", non_retryable=True,
    )  # fmt: skip
    return failed


def _not_picked_up(err: ActivityError) -> bool:
    cause = err.cause
    return isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START
