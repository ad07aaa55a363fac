"""One disruption budget per cluster: the ``DisruptionBudget`` entity workflow and the lease helpers.

``DisruptionBudget`` (``disruption-budget/<cluster>``, started on demand with signal-with-start) hands out
"node out of service" leases. Whoever takes a node out of service (a rollout batch for its ``NodeUpdate``
children, ``NodeMaintenance``, a remediation) holds a lease from before the cordon until after the
uncordon; a node left cordoned keeps its lease until its holder's run closes, then counts as cordoned.

- The budget (``count`` or ``percent`` of the cluster's nodes, NodeWright's arithmetic) is the first explicit
  one a requester gives (until then 10%), and an operator changes it with the validated ``set_budget`` update.
- Every decision re-reads the cluster, once however many requests wait: a lease is granted only while the
  nodes out of service for any reason (leased, cordoned by anyone, NotReady: one count per node) stay within
  the budget. A node already out of service costs nothing more, so it is granted at once.
- Requests wait in FIFO order: nobody who costs a node overtakes an earlier request.
- Idempotent per (holder workflow ID, node): asking again returns the same lease.
- A lease whose holder's run has closed is recovered (``liveness_interval``, ``check_interval`` while requests
  wait). A lease a requester asked for on another run's behalf (a batch for the child it is about to start)
  lives while the requester runs until its holder has been seen running, then with the holder.
- It continues-as-new, carrying its leases, queue and the decisions it still owes, before its history grows.

The protocol: signals, never a Workflow Update per node
--------------------------------------------------------
Updates are limited to 10 in flight and 2,000 per run, and the ones in flight when a run continues as new
are aborted: a rollout batch of more than 10 nodes was throttled. So a requester signals (``request_leases``,
many nodes in one signal; ``release_leases``), with signal-with-start from a local activity (a workflow cannot
start another that may already run); the entity decides once per cycle and signals each requester every
decision owed to it in one ``disruption_budget_decisions`` signal (grants, and a waiting request's place, once,
and again whenever it asks again), also from one local activity. Signal handlers only change the book, so
continue-as-new drains them (``all_handlers_finished``) and loses nothing; a signal that arrives while the run
ends makes the server refuse the end, and the handler runs first. A requester asks again every ``REPOLL`` in
case its entity was terminated. The ``acquire`` and ``release`` updates still serve runs on the update path
(started before ``SIGNAL_PATCH``); ``workflow.patched(SIGNAL_PATCH)`` picks the path, once per run.

A rollout batch asks for all its nodes (up to its ``max_in_flight``) in one request, as holder each
``NodeUpdate`` child's workflow ID (liveness and release stay per holder), receives the grants, and starts each
child with its lease; the child returns it after the uncordon. A batch paused or stopped withdraws what waits.

History events for one node's lease (W = a workflow task, 3 events; counted from tests/histories/)
  NodeUpdate: before 13 (acquire and release activities, 3 + W each, and the lease patch's marker), +6 when it
    waited (grant signal, REPOLL timer 2, W): node_update_lease.json has 118 events where node_update_reboot.json,
    from before the budget, has 95. After: 1, the release's local-activity marker inside a task it has anyway
    (node_update_batch_lease.json: 96).
  RolloutBatch, per run: SIGNAL_PATCH's marker and search attribute (2); per request signal (every node that has
    a slot, up to max_in_flight) 1 marker; per decision signal received 1 + W; a REPOLL timer (2) per wait.
  NodeMaintenance / NodeRemediation (their own requester): before 12, +6 when waiting; after 10 (2 of them
    SIGNAL_PATCH's, until it is deprecated: request marker, timer 2, decision signal + W, release marker), +4 when
    waiting (its place, signalled once, + W).
  Entity: before, per node 2 updates (accepted + completed each) with a W each, a cluster read per decision
    (activity 3 + W) and 2 per grant signalled: 13-20. After: per node 1 release signal (+ a W unless it shares
    one), per request signal 1, per decision cycle a W + 2 markers (cluster read, decisions sent) however many
    nodes it decides: 2-5 (tests/budget/test_many_holders.py, 50 holders with 6 nodes free and 0.5 s checks,
    prints about 10 per holder, most of them its periodic checks).

Task queue: the entity lives where its requesters live
------------------------------------------------------
A run is bound to its task queue and cannot be moved off a queue nobody polls any more; every run on an old
queue needs its workers until it closes, and an entity that never closed would need them forever. So (1) a
request from another task queue than the one its input names (``task_queue``, not ``workflow.info()``, which a
replay fills with the replayer's own) makes the entity continue as new onto that queue at once, the new run
deciding it (a request proves its queue is polled; while requests come from two queues it follows the latest,
one continue-as-new per switch), and (2) an entity with nothing leased or waiting closes after
``idle_close_after`` and the next request starts a fresh run on the requester's queue, which takes over the
budget an operator set (and the lease numbering) from the run before. Moving workers all at once while nothing
is leased therefore strands nothing; moving them while leases are held needs the old workers until the next
request arrives from the new queue, as every other run on the old queue needs them. A configured queue was the
alternative: it needs every worker to poll one more queue, and a misconfigured worker strands the entity all
the same.

Callers use ``acquire_lease`` / ``release_lease`` from any workflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator
from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair
from temporalio.exceptions import ActivityError

from workflows import search_attributes as sa
from workflows.base import Progress, WorkflowInput, history_is_long
from workflows.drain import API_CALL

# Models shared with the rollout and carried across continue-as-new: passed through, one class each.
with workflow.unsafe.imports_passed_through():
    from activities.entities import (
        EntityActivities,
        EntityStart,
        EntityUpdate,
        RunRef,
        WorkflowIds,
        WorkflowSignal,
        WorkflowSignals,
    )
    from activities.kube import (
        KubeActivities,
        NodeAvailability,
        UnavailableRequest,
        validate_object_name,
        validate_positive_duration,
    )
    from activities.models import StrictModel
    from workflows.rollout_policy import ceiling
    from workflows.rollout_spec import Budget

DEFAULT_BUDGET = Budget(percent=10)
GRANTED_SIGNAL = "disruption_budget_granted"  # update path: one grant per signal, to its holder
DECISIONS_SIGNAL = "disruption_budget_decisions"  # signal path: every decision owed to one requester
REQUEST_SIGNAL = "request_leases"
RELEASE_SIGNAL = "release_leases"
LEASE_PATCH = "disruption-budget-lease"  # workflow.patched() id guarding the lease in NodeUpdate/NodeMaintenance
SIGNAL_PATCH = "disruption-budget-signals"  # workflow.patched() id: the signal protocol, entity and requesters
HISTORY_LIMIT = 2000
REPOLL = timedelta(minutes=5)  # a waiting requester asks again this often, in case its entity was terminated
IDLE_CLOSE = timedelta(minutes=5)
TAKE_OVER_TIMEOUT = timedelta(minutes=1)  # a fresh run looks this long for the settings of the run before
# Update path: the update answers once decided; a retry attaches to the same update.
BUDGET_CALL = dict(
    start_to_close_timeout=timedelta(seconds=15),
    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                             maximum_interval=timedelta(seconds=30)),
)  # fmt: skip
# Signal path: a few short calls as a local activity; a worker killed during one holds the run up for a
# workflow task timeout (10 s), then another worker sends them again (receivers de-duplicate).
SIGNAL_CALL = dict(
    start_to_close_timeout=timedelta(seconds=10),
    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                             maximum_interval=timedelta(seconds=10)),
)  # fmt: skip


def budget_workflow_id(cluster: str) -> str:
    return f"disruption-budget/{cluster}"


# ================================================================== models


class Lease(StrictModel):
    """A "node out of service" lease, or a request for one waiting its turn."""

    id: str
    cluster: str
    node: str
    holder: str = Field(description="Workflow ID of the run that holds (or waits for) the lease.")
    reason: str = ""
    state: Literal["queued", "granted", "released"] = "queued"
    requested_at: datetime
    granted_at: datetime | None = None
    position: int | None = Field(None, description="Place in the queue (1: next), while queued.")
    notify: bool = Field(False, description="Update path: the holder was answered 'queued'; its grant is signalled.")
    note: str = Field("", description="Why it waits, or how it ended.")
    request_id: str = Field("", description="Signal path: the request it answers; a newer one takes it over.")
    reply_to: str | None = Field(
        None, description="Signal path: the requester told every decision (a batch, for its child); None: update path."
    )
    answer: bool = Field(False, description="Signal path: a decision is owed to reply_to.")
    holder_seen: bool = Field(False, description="The holder's run was seen running: from then on its liveness counts.")


class LeaseRequest(StrictModel):
    node: str
    holder: str = Field(min_length=1, description="The workflow ID that will hold the lease.")
    reason: str = ""
    budget: Budget | None = Field(None, description="The budget to set if the cluster has none but the default.")
    request_id: str = Field("", description="Signal path: set by the requester, new for each time it asks afresh.")

    _node = field_validator("node")(validate_object_name)


class LeaseRequests(StrictModel):
    """The ``request_leases`` signal: one requester asks for leases on one or many nodes."""

    reply_to: str = Field(min_length=1, description="The requester's workflow ID: decisions are signalled there.")
    task_queue: str = Field(min_length=1, description="The requester's task queue: the entity follows it.")
    budget: Budget | None = Field(None, description="The budget to set if the cluster has none but the default.")
    requests: list[LeaseRequest] = Field(min_length=1)


class LeaseRelease(StrictModel):
    node: str
    holder: str = Field(min_length=1)
    reason: str = ""


class LeaseReleases(StrictModel):
    """The ``release_leases`` signal: leases returned, or requests withdrawn."""

    releases: list[LeaseRelease] = Field(min_length=1)


class LeaseDecisions(StrictModel):
    """The ``disruption_budget_decisions`` signal: the entity's decisions owed to one requester."""

    leases: list[Lease]


class Released(StrictModel):
    released: bool
    lease: Lease | None = None


class BudgetChange(StrictModel):
    budget: Budget
    by: str = Field(min_length=1, description="Who changes it.")
    reason: str = Field(min_length=1, description="Why; shown with the budget.")


class BudgetBook(StrictModel):
    """What the entity remembers, carried across continue-as-new."""

    budget: Budget = Field(default_factory=lambda: DEFAULT_BUDGET.model_copy())
    budget_source: str = "default"
    leases: dict[str, Lease] = Field(default_factory=dict, description="Granted, by holder + node.")
    queue: list[Lease] = Field(default_factory=list, description="Waiting, first come first served.")
    next_id: int = 1


class DisruptionBudgetInput(WorkflowInput):
    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    budget: Budget | None = Field(None, description="The budget; unset: the first requester's, else 10%.")
    check_interval: timedelta = Field(
        timedelta(seconds=20), description="While requests wait: re-read the cluster and check holders this often."
    )
    liveness_interval: timedelta = Field(
        timedelta(seconds=60), description="While leases are held: check their holders' runs this often."
    )
    task_queue: str | None = Field(
        None, description="The task queue this run is on (requesters set it; by hand, say so). Unknown: the entity "
        "continues as new onto its first requester's queue.",
    )
    idle_close_after: timedelta = Field(
        IDLE_CLOSE, description="With nothing leased or waiting this long, close; the next request starts a new run."
    )
    history_limit: int = Field(HISTORY_LIMIT, ge=50, description="Continue-as-new past this many history events.")
    book: BudgetBook | None = Field(None, description="Carried across continue-as-new.")

    _cluster = field_validator("cluster")(validate_object_name)
    _durations = field_validator("check_interval", "liveness_interval", "idle_close_after")(validate_positive_duration)

    def workflow_id(self) -> str:
        return budget_workflow_id(self.cluster)

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster)]


class BudgetView(StrictModel):
    """The `state` query: the budget, what is out of service and why, leases and the queue."""

    cluster: str
    budget: Budget
    budget_source: str
    total_nodes: int | None = Field(None, description="At the last read of the cluster.")
    allowed: int | None = Field(None, description="Nodes allowed out of service at once, at the last read.")
    out_of_service: dict[str, str] = Field(default_factory=dict, description="Node -> why (lease, cordon, NotReady).")
    leases: list[Lease] = Field(default_factory=list)
    queue: list[Lease] = Field(default_factory=list)
    checked_at: datetime | None = None
    error: str = ""


def _key(holder: str, node: str) -> str:
    return f"{holder}|{node}"


# ================================================================== the entity


@workflow.defn
class DisruptionBudget:
    @workflow.init
    def __init__(self, inp: DisruptionBudgetInput) -> None:
        self._inp = inp
        self._book = inp.book.model_copy(deep=True) if inp.book else BudgetBook()
        if inp.book is None and inp.budget is not None:
            self._book.budget, self._book.budget_source = inp.budget, "input"
        self._avail: NodeAvailability | None = None
        self._checked_at: datetime | None = None
        self._liveness_at: datetime | None = None
        self._error = ""
        self._decisions = 0
        # A carried queue is decided at once, and carried decisions are sent.
        self._dirty = bool(self._book.queue) or any(lease.answer for lease in self._everyone())
        self._closing = False
        self._signals = False  # the signal protocol (SIGNAL_PATCH): local activities, closing when idle
        # The queue comes from the input, never from workflow.info(), which a replay fills in with its own.
        self._queue = inp.task_queue
        self._move_to: str | None = None  # a requester's task queue to continue as new onto

    # ------------------------------------------------------------ queries

    @workflow.query(description="Leases granted, then requests waiting, in order.")
    def leases(self) -> list[Lease]:
        return self._everyone()

    @workflow.query(description="Budget, nodes out of service and why, leases and queue.")
    def state(self) -> BudgetView:
        return BudgetView(
            cluster=self._inp.cluster, budget=self._book.budget, budget_source=self._book.budget_source,
            total_nodes=self._avail.total if self._avail else None, allowed=self._allowed(),
            out_of_service=self._out_of_service(), leases=list(self._book.leases.values()), queue=self._book.queue,
            checked_at=self._checked_at, error=self._error,
        )  # fmt: skip

    @workflow.query(description="Short progress for pollers.")
    def progress(self) -> Progress:
        return Progress(phase="serving", done=len(self._book.leases), total=self._allowed() or 0,
                        details=self._summary())  # fmt: skip

    # ------------------------------------------------------------ signals (the protocol of new runs)

    @workflow.signal(name=REQUEST_SIGNAL, description="Ask for leases on nodes; the decisions are signalled to "
                     "reply_to: granted, or queued with its place.")  # fmt: skip
    def request_leases(self, msg: LeaseRequests) -> None:
        self._adopt_budget(msg.budget, msg.reply_to)
        for req in msg.requests:
            lease = self._find(_key(req.holder, req.node))
            if lease is None:
                lease = self._new_lease(req)
                self._book.queue.append(lease)
            elif lease.request_id != req.request_id:
                # A new request for the same holder and node takes the lease (or the place) over: asking again
                # returns the same lease. Its holder's run is about to start again, so it has not been seen yet.
                lease.holder_seen = False
            lease.request_id, lease.reply_to, lease.answer = req.request_id, msg.reply_to, True
        if msg.task_queue != self._queue:
            self._move_to = msg.task_queue  # it is polled: a worker there just sent this
        self._dirty = True
        self._changed()

    @workflow.signal(name=RELEASE_SIGNAL, description="Return leases, or withdraw waiting requests; idempotent.")
    def release_leases(self, msg: LeaseReleases) -> None:
        for rel in msg.releases:
            self._drop(_key(rel.holder, rel.node), f"released: {rel.reason}" if rel.reason else "released")
        self._changed()

    # ------------------------------------------------------------ updates (runs still on the update path)

    @workflow.update(description="Ask for a lease on a node; answers once decided: granted, or queued with its place.")
    async def acquire(self, req: LeaseRequest) -> Lease:
        book = self._book
        self._adopt_budget(req.budget, req.holder)
        key = _key(req.holder, req.node)
        if key in book.leases:
            return book.leases[key]
        lease = self._find(key)
        if lease is None:
            lease = self._new_lease(req)
            book.queue.append(lease)
        # Asked again while queued (a holder's periodic re-ask): decide afresh too.
        self._dirty = True
        seen = self._decisions
        await workflow.wait_condition(lambda: self._decisions > seen or self._closing or lease.state != "queued")
        if lease.state == "queued":
            lease.notify = True
        self._changed()
        return lease

    @workflow.update(description="Return a lease (or withdraw a waiting request); idempotent.")
    def release(self, req: LeaseRelease) -> Released:
        lease = self._drop(_key(req.holder, req.node), f"released: {req.reason}" if req.reason else "released")
        self._changed()
        return Released(released=lease is not None, lease=lease)

    @workflow.update(description="Change the cluster's budget (count or percent of its nodes).")
    def set_budget(self, change: BudgetChange) -> BudgetView:
        self._book.budget = change.budget
        self._book.budget_source = f"operator {change.by}: {change.reason}"
        self._dirty = True  # a larger budget may let waiting requests in
        self._changed()
        return self.state()

    @set_budget.validator
    def _validate_set_budget(self, change: BudgetChange) -> None:
        total = self._avail.total if self._avail else None
        if change.budget.count is not None and total is not None and change.budget.count > total:
            raise ValueError(f"count {change.budget.count} is more than the {total} nodes of {self._inp.cluster}")

    # ------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: DisruptionBudgetInput) -> BudgetBook:
        self._signals = workflow.patched(SIGNAL_PATCH)
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster)])
        if self._signals and inp.book is None and workflow.info().continued_run_id is None:
            await self._take_over()
        self._changed()
        limit = self._inp.history_limit
        while not history_is_long(limit) and self._move_to is None:
            if self._dirty or self._wake_in() == timedelta(0):
                await self._tick()
                continue
            idle = self._signals and not self._book.leases and not self._book.queue
            try:
                await workflow.wait_condition(
                    lambda: self._dirty or history_is_long(limit) or self._move_to is not None,
                    timeout=inp.idle_close_after if idle else self._wake_in(),
                    timeout_summary="close while idle" if idle else "recheck the cluster and the holders",
                )  # fmt: skip
            except asyncio.TimeoutError:
                if idle and not self._book.leases and not self._book.queue and workflow.all_handlers_finished():
                    # Nothing to hand over but the settings: the next request starts a run on its own queue.
                    return self._book
        # Handlers waiting for a decision answer "queued" now; the queue and the decisions owed go to the next run.
        self._closing = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        queue = self._move_to or self._queue
        workflow.continue_as_new(inp.model_copy(update={"book": self._book, "task_queue": queue}),
                                 task_queue=self._move_to)

    async def _take_over(self) -> None:
        """A fresh start after the entity closed while idle: the budget an operator set, and the lease numbers,
        carry on from the run before (whatever its task queue)."""
        info = workflow.info()
        try:
            raw = await workflow.execute_local_activity_method(
                EntityActivities.previous_result, RunRef(workflow_id=info.workflow_id, run_id=info.run_id),
                **API_CALL, schedule_to_close_timeout=TAKE_OVER_TIMEOUT, summary="settings of the run before",
            )  # fmt: skip
            before = BudgetBook.model_validate(raw) if raw is not None else None
        except ActivityError as err:  # serve without them rather than not at all; say so
            self._error = f"the settings of the run before could not be read: {err.cause or err}"
            return
        except ValidationError:
            before = None  # a run of another shape: nothing to take over
        if before is None:
            return
        self._book.next_id = max(self._book.next_id, before.next_id)
        if self._inp.budget is None and before.budget_source.startswith("operator"):
            self._book.budget, self._book.budget_source = before.budget, before.budget_source

    def _wake_in(self) -> timedelta | None:
        """How long until the next periodic look; None when nothing is held or waiting."""
        now, inp = workflow.now(), self._inp
        due: list[datetime] = []
        if self._book.queue:
            due.append((self._checked_at or now) + inp.check_interval)
        if self._book.leases or self._book.queue:
            interval = inp.check_interval if self._book.queue else inp.liveness_interval
            due.append((self._liveness_at or now) + interval)
        return max(min(due) - now, timedelta(0)) if due else None

    async def _tick(self) -> None:
        self._dirty = False
        now, inp = workflow.now(), self._inp
        if self._book.queue:
            await self._decide()  # tells every requester owed a decision
        elif any(lease.answer for lease in self._everyone()):  # a granted lease asked for again
            await self._notify([])
        waiting = bool(self._book.queue)
        interval = inp.check_interval if waiting else inp.liveness_interval
        if (waiting or self._book.leases) and (self._liveness_at is None or now - self._liveness_at >= interval):
            await self._check_holders()
        self._changed()

    async def _decide(self) -> None:
        """Read the cluster once, grant what fits in FIFO order, tell the requesters."""
        try:
            self._avail = await self._activity(
                KubeActivities.node_availability, UnavailableRequest(cluster=self._inp.cluster),
                f"nodes out of service in {self._inp.cluster}",
            )  # fmt: skip
            self._error = ""
        except ActivityError as err:  # fail closed: nothing is granted without a fresh read
            self._error = f"reading the cluster failed: {err.cause or err}"
            self._checked_at = workflow.now()
            self._decisions += 1
            return
        self._checked_at = workflow.now()
        granted = self._grant(self._avail)
        self._decisions += 1
        await self._notify([g for g in granted if g.notify])

    def _grant(self, avail: NodeAvailability) -> list[Lease]:
        book, allowed = self._book, self._allowed() or 0
        out = set(avail.unavailable) | {lease.node for lease in book.leases.values()}
        granted: list[Lease] = []
        blocked = False
        for lease in list(book.queue):
            costs = lease.node not in out
            if costs and (blocked or len(out) + 1 > allowed):
                # First come, first served: nobody who costs a node overtakes a waiting request.
                blocked = True
                lease.note = f"waiting: {len(out)} of {allowed} allowed nodes out of service"
                continue
            book.queue.remove(lease)
            lease.state, lease.granted_at, lease.position = "granted", workflow.now(), None
            lease.note = "" if costs else "the node was already out of service"
            lease.answer = lease.reply_to is not None
            book.leases[_key(lease.holder, lease.node)] = lease
            out.add(lease.node)
            granted.append(lease)
        for i, lease in enumerate(book.queue, 1):
            lease.position = i
        return granted

    async def _notify(self, granted: list[Lease]) -> None:
        """Signal the grants of update-path holders, one each, and every decision owed to a signal-path requester,
        one signal per requester. A receiver whose run is gone loses its leases and requests."""
        owed: dict[str, list[Lease]] = {}
        for lease in self._everyone():
            if lease.answer and lease.reply_to is not None:
                owed.setdefault(lease.reply_to, []).append(lease.model_copy())
                lease.answer = False
        if not granted and not owed:
            return
        if self._signals:
            signals = [WorkflowSignal(workflow_id=g.holder, signal=GRANTED_SIGNAL, payload=g.model_dump(mode="json"))
                       for g in granted] + [
                WorkflowSignal(workflow_id=to, signal=DECISIONS_SIGNAL,
                               payload=LeaseDecisions(leases=leases).model_dump(mode="json"))
                for to, leases in owed.items()]  # fmt: skip
            gone = set(await workflow.execute_local_activity_method(
                EntityActivities.signal_workflows, WorkflowSignals(signals=signals), **API_CALL,
                summary=f"tell {len(signals)} requesters",
            ))  # fmt: skip
        else:  # a run started before SIGNAL_PATCH keeps signalling from the workflow, as it did
            gone = set()

            async def one(to: str, signal: str, payload: BaseModel) -> None:
                try:
                    await workflow.get_external_workflow_handle(to).signal(signal, payload)
                except Exception:  # the receiver's run is gone
                    gone.add(to)

            await asyncio.gather(*(one(g.holder, GRANTED_SIGNAL, g) for g in granted),
                                 *(one(to, DECISIONS_SIGNAL, LeaseDecisions(leases=leases))
                                   for to, leases in owed.items()))  # fmt: skip
        for lease in granted:
            if lease.holder in gone:
                self._drop(_key(lease.holder, lease.node), "recovered: the grant could not be delivered")
        for to in gone & set(owed):
            for lease in owed[to]:
                self._drop(_key(lease.holder, lease.node), f"recovered: requester {to} no longer runs")

    async def _check_holders(self) -> None:
        """Recover the leases (and drop the requests) of holders whose runs have closed."""
        everyone = self._everyone()
        ids = sorted({lease.holder for lease in everyone} | {lease.reply_to for lease in everyone if lease.reply_to})
        self._liveness_at = workflow.now()
        try:
            closed = set(await self._activity(EntityActivities.closed_workflows, WorkflowIds(ids=ids),
                                              f"check {len(ids)} holders"))  # fmt: skip
        except ActivityError as err:  # keep every lease: a holder not known dead is alive
            self._error = f"checking holders failed: {err.cause or err}"
            return
        for lease in everyone:
            if lease.holder not in closed:
                lease.holder_seen = True
            elif lease.holder_seen or lease.reply_to in (None, lease.holder) or lease.reply_to in closed:
                # Asked for by another run (a batch, for the child it starts with the lease): alive while that
                # run is, until the holder has been seen running.
                self._drop(_key(lease.holder, lease.node), f"recovered: holder {lease.holder} closed")

    async def _activity(self, method: Callable, arg: BaseModel, summary: str) -> Any:
        """A short read: a local activity (one event) on the signal protocol, an activity on runs from before."""
        if self._signals:
            return await workflow.execute_local_activity_method(method, arg, **API_CALL, summary=summary)
        return await workflow.execute_activity_method(method, arg, **API_CALL, summary=summary)

    # ------------------------------------------------------------ the book

    def _everyone(self) -> list[Lease]:
        return list(self._book.leases.values()) + self._book.queue

    def _find(self, key: str) -> Lease | None:
        return self._book.leases.get(key) or next((q for q in self._book.queue if _key(q.holder, q.node) == key), None)

    def _new_lease(self, req: LeaseRequest) -> Lease:
        book = self._book
        lease = Lease(id=f"lease-{book.next_id}", cluster=self._inp.cluster, node=req.node, holder=req.holder,
                      reason=req.reason, requested_at=workflow.now())  # fmt: skip
        book.next_id += 1
        return lease

    def _adopt_budget(self, budget: Budget | None, requester: str) -> None:
        if budget is not None and self._book.budget_source == "default":
            self._book.budget, self._book.budget_source = budget, f"first requester {requester}"

    def _drop(self, key: str, note: str) -> Lease | None:
        book = self._book
        lease = book.leases.pop(key, None)
        if lease is None:
            lease = next((q for q in book.queue if _key(q.holder, q.node) == key), None)
            if lease is not None:
                book.queue.remove(lease)
        if lease is not None:
            lease.state, lease.position, lease.note, lease.answer = "released", None, note, False
            self._dirty = True  # room for whoever waits
        return lease

    # ------------------------------------------------------------ visibility

    def _allowed(self) -> int | None:
        return ceiling(self._book.budget, self._avail.total) if self._avail else None

    def _out_of_service(self) -> dict[str, str]:
        out = dict(sorted((self._avail.unavailable if self._avail else {}).items()))
        for lease in self._book.leases.values():
            why = f"{lease.id} ({lease.holder})"
            out[lease.node] = f"{out[lease.node]}, {why}" if lease.node in out else why
        return out

    def _summary(self) -> str:
        b, total = self._book.budget, self._avail.total if self._avail else None
        budget = f"{b.count} nodes" if b.count is not None else f"{b.percent}%"
        line = (f"budget {budget} ({self._book.budget_source}) = {self._allowed() if total is not None else '?'} "
                f"of {total if total is not None else '?'} nodes: {len(self._out_of_service())} out of service, "
                f"{len(self._book.leases)} leased, {len(self._book.queue)} waiting")  # fmt: skip
        if self._book.queue:
            line += f" (next: {self._book.queue[0].node} for {self._book.queue[0].holder})"
        return line + (f"; {self._error}" if self._error else "")

    def _changed(self) -> None:
        workflow.set_current_details(self._summary())


# ================================================================== helpers for any workflow


class _Ask:
    """One request for a lease on the signal path, and the entity's latest decision about it."""

    def __init__(self, cluster: str, request: LeaseRequest, budget: Budget | None) -> None:
        self.cluster, self.request, self.budget = cluster, request, budget
        self.lease: Lease | None = None
        self.decisions = 0

    @property
    def granted(self) -> bool:
        return self.lease is not None and self.lease.state == "granted"


class _Requester:
    """This run's side of the budget protocol: its requests, the signals it has yet to send, the decisions
    signalled back. One per workflow run, with its signal handlers.

    Whatever the run asks in one workflow task (a batch: every node that has a slot) leaves in one signal per
    cluster, from one local activity; a task that sends keeps its order (a withdrawal before the next request)."""

    def __init__(self) -> None:
        self.signals: bool | None = None  # the protocol of this run, fixed at its first acquire_lease
        self.granted: dict[str, Lease] = {}  # update path: grants signalled, by lease ID
        self.asks: dict[tuple[str, str, str], _Ask] = {}  # signal path: (cluster, holder, node) -> waiting request
        self.outbox: list[tuple[str, str, BaseModel, Budget | None]] = []  # (cluster, signal, item, budget)
        self.posted = self.sent = 0
        self.sending = False

    def grant_signalled(self, lease: Lease) -> None:
        self.granted[lease.id] = lease

    def decided(self, msg: LeaseDecisions) -> None:
        for lease in msg.leases:
            ask = self.asks.get((lease.cluster, lease.holder, lease.node))
            if ask is not None and ask.request.request_id == lease.request_id:  # not a stale answer
                ask.lease, ask.decisions = lease, ask.decisions + 1

    def ask(self, cluster: str, request: LeaseRequest, budget: Budget | None) -> _Ask:
        ask = _Ask(cluster, request, budget)
        self.asks[(cluster, request.holder, request.node)] = ask
        self._post(cluster, REQUEST_SIGNAL, request, budget)
        return ask

    def forget(self, ask: _Ask) -> None:
        self.asks.pop((ask.cluster, ask.request.holder, ask.request.node), None)

    async def release(self, cluster: str, release: LeaseRelease) -> None:
        """Send the release (or withdrawal) and wait until the entity has it."""
        posted = self._post(cluster, RELEASE_SIGNAL, release, None)
        await workflow.wait_condition(lambda: self.sent >= posted)

    def _post(self, cluster: str, signal: str, item: BaseModel, budget: Budget | None) -> int:
        self.outbox.append((cluster, signal, item, budget))
        self.posted += 1
        if not self.sending:
            self.sending = True
            asyncio.create_task(self._send())
        return self.posted

    def _waiting(self) -> bool:
        return any(not ask.granted for ask in self.asks.values())

    async def _send(self) -> None:
        """Send what is posted; while requests wait, ask again every REPOLL. Ends when neither is left, so that
        nothing of it outlives the run's last wait."""
        try:
            while self.outbox or self._waiting():
                if not self.outbox:
                    try:
                        await workflow.wait_condition(lambda: bool(self.outbox) or not self._waiting(), timeout=REPOLL,
                                                      timeout_summary="ask the disruption budget again")  # fmt: skip
                    except asyncio.TimeoutError:  # in case the entity was terminated: it is started afresh
                        for ask in self.asks.values():
                            if not ask.granted:
                                self._post(ask.cluster, REQUEST_SIGNAL, ask.request, ask.budget)
                    continue
                batch, self.outbox = self.outbox, []
                await workflow.execute_local_activity_method(
                    EntityActivities.signal_workflows, WorkflowSignals(signals=_coalesce(batch)), **SIGNAL_CALL,
                    summary=f"{len(batch)} lease requests and releases",
                )  # fmt: skip
                self.sent += len(batch)
        finally:
            self.sending = False


def _coalesce(batch: list[tuple[str, str, BaseModel, Budget | None]]) -> list[WorkflowSignal]:
    """Consecutive requests (or releases) for one cluster, in one signal each; the order kept."""
    info = workflow.info()
    groups: list[tuple[str, str, Budget | None, list[BaseModel]]] = []
    for cluster, signal, item, budget in batch:
        if groups and groups[-1][:3] == (cluster, signal, budget):
            groups[-1][3].append(item)
        else:
            groups.append((cluster, signal, budget, [item]))
    signals = []
    for cluster, signal, budget, items in groups:
        message: BaseModel = (
            LeaseRequests(reply_to=info.workflow_id, task_queue=info.task_queue, budget=budget, requests=items)
            if signal == REQUEST_SIGNAL else LeaseReleases(releases=items)
        )  # fmt: skip
        start = EntityStart(workflow_type="DisruptionBudget",
                            start_input={"cluster": cluster, "task_queue": info.task_queue},
                            task_queue=info.task_queue, keywords={sa.CLUSTER.name: cluster})  # fmt: skip
        signals.append(WorkflowSignal(workflow_id=budget_workflow_id(cluster), signal=signal,
                                      payload=message.model_dump(mode="json"), start=start))  # fmt: skip
    return signals


def _requester() -> _Requester:
    instance = workflow.instance()
    requester = getattr(instance, "_millwright_leases", None)
    if requester is None:
        requester = _Requester()
        setattr(instance, "_millwright_leases", requester)
        workflow.set_signal_handler(GRANTED_SIGNAL, requester.grant_signalled)
        workflow.set_signal_handler(DECISIONS_SIGNAL, requester.decided)
    return requester


async def _call(cluster: str, update: str, payload: BaseModel, summary: str) -> dict:
    return await workflow.execute_activity_method(
        EntityActivities.update_entity,
        EntityUpdate(
            workflow_type="DisruptionBudget", workflow_id=budget_workflow_id(cluster),
            start_input={"cluster": cluster}, update=update, payload=payload.model_dump(mode="json"),
            keywords={sa.CLUSTER.name: cluster}, refused_type="DisruptionBudgetRefused",
            entity=f"disruption budget of {cluster}",
        ),
        **BUDGET_CALL, summary=summary,
    )  # fmt: skip


async def acquire_lease(
    cluster: str,
    node: str,
    holder: str | None = None,
    reason: str = "",
    budget: Budget | None = None,
    *,
    cancelled: Callable[[], bool] = lambda: False,
    paused: Callable[[], bool] = lambda: False,
    waiting: Callable[[Lease], None] | None = None,
) -> Lease | None:
    """Wait for the cluster's disruption budget to let `node` out of service; returns the granted lease.

    `holder` defaults to this run's workflow ID; another ID (a child this run will start with the lease) holds
    it while this run asks and hears the decisions. Asking again with the same holder and node returns the same
    lease. `budget` sets the cluster's budget if it has none but the default. `waiting(lease)` is called each
    time the request is (still) queued, with its place. When `cancelled()` turns true while waiting, the request
    is withdrawn and None returned; while `paused()` is true it is withdrawn and asked afresh on resume (a paused
    run holds no place). Runs on the update path (started before SIGNAL_PATCH) ignore `paused`.
    """
    holder = holder or workflow.info().workflow_id
    requester = _requester()
    if requester.signals is None:
        requester.signals = workflow.patched(SIGNAL_PATCH)
    request = LeaseRequest(node=node, holder=holder, reason=reason)
    if not requester.signals:
        return await _acquire_by_update(requester, cluster, request.model_copy(update={"budget": budget}),
                                        cancelled, waiting)  # fmt: skip
    while True:
        if paused():
            await workflow.wait_condition(lambda: not paused() or cancelled())
        if cancelled():
            return None
        ask = requester.ask(cluster, request.model_copy(update={"request_id": str(workflow.uuid4())}), budget)
        seen = 0
        while True:
            await workflow.wait_condition(lambda: ask.decisions != seen or cancelled() or paused())
            if cancelled() or paused():
                requester.forget(ask)
                withdrawn = LeaseRelease(node=node, holder=holder, reason="withdrawn while waiting")
                await requester.release(cluster, withdrawn)
                break
            seen = ask.decisions
            assert ask.lease is not None
            if ask.granted:
                requester.forget(ask)
                return ask.lease
            if waiting is not None:
                waiting(ask.lease)


async def _acquire_by_update(
    requester: _Requester, cluster: str, request: LeaseRequest, cancelled: Callable[[], bool],
    waiting: Callable[[Lease], None] | None,
) -> Lease | None:  # fmt: skip
    """The update path, for runs started before SIGNAL_PATCH (their histories replay through it)."""
    summary = f"lease {request.node} from the disruption budget"
    lease = Lease.model_validate(await _call(cluster, "acquire", request, summary))
    while lease.state != "granted":
        if waiting is not None:
            waiting(lease)
        wanted = lease.id
        try:
            await workflow.wait_condition(
                lambda: wanted in requester.granted or cancelled(), timeout=REPOLL,
                timeout_summary=f"waiting for the disruption budget of {cluster} ({request.node})",
            )  # fmt: skip
        except asyncio.TimeoutError:
            pass
        if cancelled():
            await release_lease(cluster, request.node, request.holder, "withdrawn while waiting")
            return None
        signalled = requester.granted.pop(wanted, None)
        lease = signalled or Lease.model_validate(
            await _call(cluster, "acquire", request, f"ask again for {request.node}")
        )
    return lease


async def release_lease(cluster: str, node: str, holder: str | None = None, reason: str = "") -> None:
    """Return the lease on `node` (or withdraw the request), once the entity has it. A lease handed to this run
    (a NodeUpdate started by its batch) goes back on the signal path; one this run asked for, the way it asked."""
    holder = holder or workflow.info().workflow_id
    requester = _requester()
    if requester.signals is False:
        release = LeaseRelease(node=node, holder=holder, reason=reason)
        await _call(cluster, "release", release, f"return lease on {node}")
        return
    await requester.release(cluster, LeaseRelease(node=node, holder=holder, reason=reason))
