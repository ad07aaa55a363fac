"""One disruption budget per cluster: the ``DisruptionBudget`` entity workflow and the lease helpers.

``DisruptionBudget`` (``disruption-budget/<cluster>``, started on demand with update-with-start, like the
``Fabric``) hands out "node out of service" leases. Whoever takes a node out of service (a rollout's
``NodeUpdate``, ``NodeMaintenance``, a remediation) acquires a lease before the cordon and releases it after
the uncordon; a node left cordoned keeps its lease until its holder's run closes, then counts as cordoned.

- The budget (``count`` or ``percent`` of the cluster's nodes, NodeWright's arithmetic) is the first explicit
  one a requester gives (until then 10%), and an operator changes it with the validated ``set_budget`` update.
- Every decision re-reads the cluster: a lease is granted only while the nodes out of service for any reason
  (leased, cordoned by anyone, NotReady: one count per node) stay within the budget. A node already out of
  service costs nothing more, so it is granted at once.
- Requests that cannot be granted wait in FIFO order. ``acquire`` answers once the request has been decided
  (granted, or queued with its place); a queued holder is signalled (``disruption_budget_granted``) when it is
  granted, and asks again every few minutes in case a signal was lost.
- Idempotent per (holder workflow ID, node): asking again returns the same lease.
- A lease whose holder's run has closed is recovered: the entity checks its holders with an activity while
  leases are held (``liveness_interval``) and when a request waits (``check_interval``).
- It continues-as-new, carrying its leases and queue, before its history grows large.

Callers use ``acquire_lease`` / ``release_lease`` from any workflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field, field_validator
from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair
from temporalio.exceptions import ActivityError

from workflows import search_attributes as sa
from workflows.base import Progress, WorkflowInput, history_is_long
from workflows.drain import API_CALL

# Models shared with the rollout and carried across continue-as-new: passed through, one class each.
with workflow.unsafe.imports_passed_through():
    from activities.entities import EntityActivities, EntityUpdate, WorkflowIds
    from activities.kube import KubeActivities, NodeAvailability, UnavailableRequest, validate_object_name
    from activities.models import StrictModel
    from workflows.rollout_policy import ceiling
    from workflows.rollout_spec import Budget

DEFAULT_BUDGET = Budget(percent=10)
GRANTED_SIGNAL = "disruption_budget_granted"
LEASE_PATCH = "disruption-budget-lease"  # workflow.patched() id guarding the lease in NodeUpdate/NodeMaintenance
HISTORY_LIMIT = 2000
REPOLL = timedelta(minutes=5)  # a queued holder asks again this often, in case a grant signal was lost
BUDGET_CALL = dict(
    start_to_close_timeout=timedelta(seconds=60),
    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                             maximum_interval=timedelta(seconds=30)),
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
    notify: bool = Field(False, description="The holder was answered 'queued': its grant is signalled.")
    note: str = Field("", description="Why it waits, or how it ended.")


class LeaseRequest(StrictModel):
    node: str
    holder: str = Field(min_length=1, description="The requesting run's workflow ID.")
    reason: str = ""
    budget: Budget | None = Field(None, description="The budget to set if the cluster has none but the default.")

    _node = field_validator("node")(validate_object_name)


class LeaseRelease(StrictModel):
    node: str
    holder: str = Field(min_length=1)
    reason: str = ""


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
    history_limit: int = Field(HISTORY_LIMIT, ge=50, description="Continue-as-new past this many history events.")
    book: BudgetBook | None = Field(None, description="Carried across continue-as-new.")

    _cluster = field_validator("cluster")(validate_object_name)

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
        self._dirty = bool(self._book.queue)  # a carried queue is decided at once
        self._closing = False

    # ------------------------------------------------------------ queries

    @workflow.query(description="Leases granted, then requests waiting, in order.")
    def leases(self) -> list[Lease]:
        return list(self._book.leases.values()) + self._book.queue

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

    # ------------------------------------------------------------ updates

    @workflow.update(description="Ask for a lease on a node; answers once decided: granted, or queued with its place.")
    async def acquire(self, req: LeaseRequest) -> Lease:
        book = self._book
        if req.budget is not None and book.budget_source == "default":
            book.budget, book.budget_source = req.budget, f"first requester {req.holder}"
        key = _key(req.holder, req.node)
        if key in book.leases:
            return book.leases[key]
        lease = next((q for q in book.queue if _key(q.holder, q.node) == key), None)
        if lease is None:
            lease = Lease(id=f"lease-{book.next_id}", cluster=self._inp.cluster, node=req.node, holder=req.holder,
                          reason=req.reason, requested_at=workflow.now())  # fmt: skip
            book.next_id += 1
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
    async def run(self, inp: DisruptionBudgetInput) -> None:
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster)])
        self._changed()
        while not history_is_long(self._inp.history_limit):
            if self._dirty or self._wake_in() == timedelta(0):
                await self._tick()
                continue
            try:
                await workflow.wait_condition(
                    lambda: self._dirty or history_is_long(self._inp.history_limit), timeout=self._wake_in(),
                    timeout_summary="recheck the cluster and the holders",
                )  # fmt: skip
            except asyncio.TimeoutError:
                pass
        # Handlers waiting for a decision answer "queued" now; the queue goes to the next run.
        self._closing = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(inp.model_copy(update={"book": self._book}))

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
            await self._decide()
        waiting = bool(self._book.queue)
        interval = inp.check_interval if waiting else inp.liveness_interval
        if (waiting or self._book.leases) and (self._liveness_at is None or now - self._liveness_at >= interval):
            await self._check_holders()
        self._changed()

    async def _decide(self) -> None:
        """Read the cluster, grant what fits in FIFO order, tell the queued holders granted."""
        try:
            self._avail = await workflow.execute_activity_method(
                KubeActivities.node_availability, UnavailableRequest(cluster=self._inp.cluster), **API_CALL,
                summary=f"nodes out of service in {self._inp.cluster}",
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
            book.leases[_key(lease.holder, lease.node)] = lease
            out.add(lease.node)
            granted.append(lease)
        for i, lease in enumerate(book.queue, 1):
            lease.position = i
        return granted

    async def _notify(self, granted: list[Lease]) -> None:
        async def one(lease: Lease) -> None:
            try:
                await workflow.get_external_workflow_handle(lease.holder).signal(GRANTED_SIGNAL, lease)
            except Exception as err:  # the holder's run is gone: the lease goes back
                self._drop(_key(lease.holder, lease.node), f"recovered: the grant could not be delivered ({err})")

        await asyncio.gather(*(one(lease) for lease in granted))

    async def _check_holders(self) -> None:
        """Recover the leases (and drop the requests) of holders whose runs have closed."""
        book = self._book
        holders = sorted({lease.holder for lease in list(book.leases.values()) + book.queue})
        self._liveness_at = workflow.now()
        try:
            closed = set(await workflow.execute_activity_method(
                EntityActivities.closed_workflows, WorkflowIds(ids=holders), **API_CALL,
                summary=f"check {len(holders)} holders",
            ))  # fmt: skip
        except ActivityError as err:  # keep every lease: a holder not known dead is alive
            self._error = f"checking holders failed: {err.cause or err}"
            return
        for lease in [lease for lease in list(book.leases.values()) + book.queue if lease.holder in closed]:
            self._drop(_key(lease.holder, lease.node), f"recovered: holder {lease.holder} closed")

    def _drop(self, key: str, note: str) -> Lease | None:
        book = self._book
        lease = book.leases.pop(key, None)
        if lease is None:
            lease = next((q for q in book.queue if _key(q.holder, q.node) == key), None)
            if lease is not None:
                book.queue.remove(lease)
        if lease is not None:
            lease.state, lease.position, lease.note = "released", None, note
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


class _Inbox:
    """Grants signalled to this run, by lease ID; one signal handler per workflow run."""

    def __init__(self) -> None:
        self.granted: dict[str, Lease] = {}


def _inbox() -> _Inbox:
    instance = workflow.instance()
    inbox = getattr(instance, "_millwright_lease_inbox", None)
    if inbox is None:
        inbox = _Inbox()
        setattr(instance, "_millwright_lease_inbox", inbox)

        def granted(lease: Lease) -> None:
            inbox.granted[lease.id] = lease

        workflow.set_signal_handler(GRANTED_SIGNAL, granted)
    return inbox


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
    waiting: Callable[[Lease], None] | None = None,
) -> Lease | None:
    """Wait for the cluster's disruption budget to let `node` out of service; returns the granted lease.

    `holder` defaults to this run's workflow ID (asking again with the same holder and node returns the same
    lease). `budget` sets the cluster's budget if it has none but the default. `waiting(lease)` is called each
    time the request is (still) queued; when `cancelled()` turns true while waiting, the request is withdrawn
    and None returned.
    """
    holder = holder or workflow.info().workflow_id
    inbox = _inbox()
    request = LeaseRequest(node=node, holder=holder, reason=reason, budget=budget)
    lease = Lease.model_validate(await _call(cluster, "acquire", request, f"lease {node} from the disruption budget"))
    while lease.state != "granted":
        if waiting is not None:
            waiting(lease)
        wanted = lease.id
        try:
            await workflow.wait_condition(
                lambda: wanted in inbox.granted or cancelled(), timeout=REPOLL,
                timeout_summary=f"waiting for the disruption budget of {cluster} ({node})",
            )  # fmt: skip
        except asyncio.TimeoutError:
            pass
        if cancelled():
            await release_lease(cluster, node, holder, "withdrawn while waiting")
            return None
        signalled = inbox.granted.pop(wanted, None)
        lease = signalled or Lease.model_validate(
            await _call(cluster, "acquire", request, f"ask again for {node}")
        )
    return lease


async def release_lease(cluster: str, node: str, holder: str | None = None, reason: str = "") -> Lease | None:
    """Return the lease on `node` (or withdraw the request); the released lease, None if there was none."""
    holder = holder or workflow.info().workflow_id
    raw = await _call(cluster, "release", LeaseRelease(node=node, holder=holder, reason=reason), f"return lease on {node}")
    return Released.model_validate(raw).lease
