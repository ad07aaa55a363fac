"""One disruption budget per cluster: the ``DisruptionBudget`` entity workflow (``disruption-budget/<cluster>``).

Whoever takes a node out of service (a rollout batch for its ``NodeUpdate`` children, ``NodeMaintenance``, a
remediation, a burn-in, a firmware update) holds a lease from before the cordon until after the uncordon. The
entity reads the cluster, feeds the lease book (workflows/budget/book.py) what its signals carry, and signals
each requester its decisions; it holds the cluster's remediation circuit breaker (workflows/budget/breaker.py).
Callers use ``acquire_lease`` / ``release_lease``, or ``acquire_leases`` / ``release_leases`` for a group of nodes
taken together (workflows/budget/leases.py), from any workflow. The protocol, its cost in history events, the task
queue it lives on and why its decisions follow its history alone are in docs/disruption-budget.md; its models are
in workflows/budget/models.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.common import VersioningBehavior
from temporalio.exceptions import ActivityError

from activities.entities import EntityActivities, RunRef, WorkflowIds, WorkflowSignal, WorkflowSignals
from activities.kube.activities import KubeActivities
from activities.kube.models import NodeAvailability, UnavailableRequest
from workflows.budget.book import BudgetBook, budget_text, lease_key
from workflows.budget.breaker import (
    BREAKER_PATCH,
    BREAKER_QUERY,
    RESET_UPDATE,
    SERVING_PHASE,
    TRIPPED_GAUGE,
    TRIPPED_PHASE,
    TRIPS_COUNTER,
    BreakerReset,
    BreakerView,
)
from workflows.budget.budget import ceiling
from workflows.budget.control_plane import CONTROL_PLANE_PATCH
from workflows.budget.leases import (
    DECISIONS_SIGNAL,
    GRANTED_SIGNAL,
    RELEASE_SIGNAL,
    REQUEST_SIGNAL,
    SIGNAL_PATCH,
    Lease,
    LeaseDecisions,
    LeaseRelease,
    LeaseReleases,
    LeaseRequest,
    LeaseRequests,
)
from workflows.budget.models import (
    BudgetChange,
    BudgetView,
    DisruptionBudgetInput,
    Released,
    operator_note,
)
from workflows.budget.units import UnitsOut
from workflows.common import search_attributes as sa
from workflows.common.base import Progress, history_is_long, publish_phase
from workflows.common.call_options import API_CALL

TAKE_OVER_TIMEOUT = timedelta(minutes=1)  # a fresh run looks this long for the settings of the run before
# workflow.patched() id: decisions no longer compare workflow.now() with remembered times (see _tick).
EVENT_CLOCK_PATCH = "disruption-budget-event-clock"
# workflow.patched() id: only an operator sets the cluster's budget; a requester's caps its own leases (book.grant).
OPERATOR_BUDGET_PATCH = "disruption-budget-operator-budget"
MIN_WAIT = timedelta(seconds=1)  # the shortest periodic wait: a timer always stands for "a periodic look is due"


Received = LeaseRequests | LeaseReleases | BudgetChange | BreakerReset  # what handlers file on EVENT_CLOCK_PATCH


# ================================================================== the entity


@workflow.defn(versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class DisruptionBudget:
    @workflow.init
    def __init__(self, inp: DisruptionBudgetInput) -> None:
        self._inp = inp
        self._book = inp.book.model_copy(deep=True) if inp.book else BudgetBook()
        if inp.book is None and inp.budget is not None:
            self._book.budget, self._book.budget_source = inp.budget, "input"
        # Read here, before any handler runs: the first request may arrive in the run's first task.
        self._own_budgets = workflow.patched(OPERATOR_BUDGET_PATCH)
        if self._own_budgets:
            self._book.forget_requester_budget()
        self._avail: NodeAvailability | None = None
        self._placed = False  # the last read placed the nodes out of service (a limit was set)
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
        self._breaker = False  # this run keeps the remediation circuit breaker (BREAKER_PATCH)
        self._control_plane = False  # this run spares the control plane (CONTROL_PLANE_PATCH)
        self._event_clock = False  # EVENT_CLOCK_PATCH: the loop of _serve (below)
        self._due = False  # the periodic timer fired: check the holders (and re-decide) at the next tick
        self._inbox: list[Received] = []  # messages handlers received, applied to the book at the next tick
        self._ticker: asyncio.Task[None] | None = None  # the one periodic timer (_arm)
        self._ticker_kind = ""
        self._refused: list[Lease] = []  # remediations refused by the breaker, their decisions not yet sent

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
            control_plane_at_once=self._book.control_plane_at_once, own_budgets=self._book.own_budgets(self._avail),
            checked_at=self._checked_at, error=self._error, limits=self._book.limits, **self._units_view(),
        )  # fmt: skip

    @workflow.query(name=BREAKER_QUERY, description="The remediation circuit breaker: tripped or not, why, and "
                    "the nodes remediation took within their windows.")  # fmt: skip
    def breaker(self) -> BreakerView:
        b = self._book.breaker
        return BreakerView(cluster=self._inp.cluster, enabled=self._breaker, **b.model_dump())

    @workflow.query(description="Short progress for pollers.")
    def progress(self) -> Progress:
        return Progress(phase="serving", done=len(self._book.leases), total=self._allowed() or 0,
                        details=self._summary())  # fmt: skip

    # ------------------------------------------------------------ signals (the protocol of new runs)

    @workflow.signal(name=REQUEST_SIGNAL, description="Ask for leases on nodes; the decisions are signalled to "
                     "reply_to: granted, or queued with its place.")  # fmt: skip
    def request_leases(self, msg: LeaseRequests) -> None:
        if self._receive(msg):
            return
        self._take_requests(msg)
        self._changed()

    def _take_requests(self, msg: LeaseRequests) -> None:
        self._book.take_requests(msg, self._inp.cluster, workflow.now(), own_budgets=self._own_budgets)
        if msg.task_queue != self._queue:
            self._move_to = msg.task_queue  # it is polled: a worker there just sent this
        self._dirty = True

    @workflow.signal(name=RELEASE_SIGNAL, description="Return leases, or withdraw waiting requests; idempotent.")
    def release_leases(self, msg: LeaseReleases) -> None:
        if self._receive(msg):
            return
        self._take_releases(msg)
        self._changed()

    def _take_releases(self, msg: LeaseReleases) -> None:
        for rel in msg.releases:
            self._drop(lease_key(rel.holder, rel.node), f"released: {rel.reason}" if rel.reason else "released")

    def _receive(self, msg: Received) -> bool:
        """On EVENT_CLOCK_PATCH a handler only files its message; the loop applies it (_apply_received). True:
        filed. A worker can hand a local activity's result to the workflow together with the signals of a later
        task where a replay hands it over before them, so a book that handlers changed directly was decided on
        with more requests live than in the replay (a breaker tripped live and not in the replay)."""
        if not self._event_clock:
            return False
        self._inbox.append(msg)
        return True

    def _apply_received(self) -> None:
        received, self._inbox = self._inbox, []
        for msg in received:
            if isinstance(msg, LeaseRequests):
                self._take_requests(msg)
            elif isinstance(msg, LeaseReleases):
                self._take_releases(msg)
            elif isinstance(msg, BudgetChange):
                self._set_budget(msg)
            else:
                self._reset_breaker(msg)

    # ------------------------------------------------------------ updates (runs still on the update path)

    @workflow.update(description="Ask for a lease on a node; answers once decided: granted, or queued with its place.")
    async def acquire(self, req: LeaseRequest) -> Lease:
        book = self._book
        if not self._own_budgets:
            self._book.adopt_budget(req.budget, req.holder)
        key = lease_key(req.holder, req.node)
        if key in book.leases:
            return book.leases[key]
        lease = self._book.find(key)
        if lease is None:
            lease = self._book.new_lease(req, self._inp.cluster, workflow.now())
            book.queue.append(lease)
        # Asked again while queued (a holder's periodic re-ask): decide afresh too.
        self._dirty = True
        seen = self._decisions
        await workflow.wait_condition(lambda: self._decisions > seen or self._closing or lease.state != "queued")
        if lease.state == "queued":
            lease.notify = True
        self._changed()
        return lease

    @acquire.validator
    def _validate_acquire(self, req: LeaseRequest) -> None:
        if req.group is not None:  # one update per node: the group's first member would be decided alone
            raise ValueError(f"group {req.group}: a group's requests come in one `{REQUEST_SIGNAL}` signal "
                             "(acquire_leases), never by update")  # fmt: skip

    @workflow.update(description="Return a lease (or withdraw a waiting request); idempotent.")
    def release(self, req: LeaseRelease) -> Released:
        lease = self._drop(lease_key(req.holder, req.node), f"released: {req.reason}" if req.reason else "released")
        self._changed()
        return Released(released=lease is not None, lease=lease)

    @workflow.update(description="Change the cluster's budget (count or percent of its nodes).")
    def set_budget(self, change: BudgetChange) -> BudgetView:
        if self._receive(change):  # applied at once by the loop; answered as it will be
            view = self.state()
            view.budget, view.budget_source = change.budget, operator_note(change)
            view.allowed = ceiling(change.budget, self._avail.total) if self._avail else None
            if change.control_plane_at_once is not None:
                view.control_plane_at_once = change.control_plane_at_once
            view.limits = change.limits(self._book.limits)
            return view
        self._set_budget(change)
        self._changed()
        return self.state()

    def _set_budget(self, change: BudgetChange) -> None:
        self._book.budget, self._book.budget_source = change.budget, operator_note(change)
        if change.control_plane_at_once is not None:
            self._book.control_plane_at_once = change.control_plane_at_once
        self._book.limits = change.limits(self._book.limits)
        self._dirty = True  # a larger budget may let waiting requests in

    @set_budget.validator
    def _validate_set_budget(self, change: BudgetChange) -> None:
        total = self._avail.total if self._avail else None
        if change.budget.count is not None and total is not None and change.budget.count > total:
            raise ValueError(f"count {change.budget.count} is more than the {total} nodes of {self._inp.cluster}")

    @workflow.update(name=RESET_UPDATE, description="Close the remediation circuit breaker (an operator, once the "
                     "cause is found): automated remediation resumes; what it took so far is forgotten.")  # fmt: skip
    def reset_breaker(self, reset: BreakerReset) -> BreakerView:
        if self._receive(reset):  # applied at once by the loop; answered as it will be
            closed = self._book.breaker.model_copy(deep=True)
            closed.clear(reset, workflow.now())
            return BreakerView(cluster=self._inp.cluster, enabled=self._breaker, **closed.model_dump())
        self._reset_breaker(reset)
        self._changed()
        return self.breaker()

    def _reset_breaker(self, reset: BreakerReset) -> None:
        self._book.breaker.clear(reset, workflow.now())
        self._dirty = True  # look again: an idle entity may close now
        self._breaker_changed()

    @reset_breaker.validator
    def _validate_reset_breaker(self, reset: BreakerReset) -> None:
        if not self._breaker:
            raise ValueError(f"this run of the disruption budget of {self._inp.cluster} predates the circuit breaker "
                             "(it has none to reset); it gets one at its next continue-as-new")  # fmt: skip

    # ------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: DisruptionBudgetInput) -> BudgetBook:
        self._signals = workflow.patched(SIGNAL_PATCH)
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster)])
        self._breaker = workflow.patched(BREAKER_PATCH)
        self._control_plane = workflow.patched(CONTROL_PLANE_PATCH)
        self._event_clock = workflow.patched(EVENT_CLOCK_PATCH)
        if self._signals and inp.book is None and workflow.info().continued_run_id is None:
            await self._take_over()
        if self._breaker:
            self._breaker_changed()
        self._changed()
        limit = self._inp.history_limit
        if self._event_clock and await self._serve(limit):
            return self._book
        while not self._event_clock and not history_is_long(limit) and self._move_to is None:
            if self._dirty or self._wake_in() == timedelta(0):
                await self._tick()
                continue
            # A tripped breaker keeps the entity running: visible in the list, and answering the sweep's query.
            idle = self._signals and self._idle()
            try:
                await workflow.wait_condition(
                    lambda: self._dirty or history_is_long(limit) or self._move_to is not None,
                    timeout=inp.idle_close_after if idle else self._wake_in(),
                    timeout_summary="close while idle" if idle else "recheck the cluster and the holders",
                )  # fmt: skip
            except TimeoutError:
                if idle and self._idle() and workflow.all_handlers_finished():
                    # Nothing to hand over but the settings: the next request starts a run on its own queue.
                    return self._book
        # Handlers waiting for a decision answer "queued" now; the queue and the decisions owed go to the next run.
        self._closing = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._apply_received()  # what arrived since the last tick goes to the next run in the book
        queue = self._move_to or self._queue
        workflow.continue_as_new(
            inp.model_copy(update={"book": self._book, "task_queue": queue}), task_queue=self._move_to
        )

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
        self._book.breaker = before.breaker  # what remediation took within its windows still counts
        # An operator's change made since this run started (`millwright budget set` starts it) is the newer one.
        newer = self._own_budgets and self._book.budget_source.startswith("operator")
        if self._inp.budget is None and before.budget_source.startswith("operator") and not newer:
            self._book.budget, self._book.budget_source = before.budget, before.budget_source
            self._book.control_plane_at_once = before.control_plane_at_once
            self._book.limits = before.limits

    async def _serve(self, limit: int) -> bool:
        """The loop of runs on EVENT_CLOCK_PATCH: serve until the history is long or a requester's queue calls;
        True: close, idle (nothing to hand over but the settings: the next request starts a run on its own queue).

        Which commands the entity issues follows from its history alone: handlers only file messages, applied
        at the start of a tick; one timer at a time (the ticker) stands for the periodic look and is started or
        replaced only at the end of a tick or when it fired, never because of the clock; and a decision is made
        at the cluster read's own time (``read_at``, recorded with its result). ``workflow.now()`` is not
        history: a worker that resumed a run after its workflow task timed out saw the clock of an earlier task
        where the replay saw the later one, and "has the interval passed?" started a timer live where the
        replay read the cluster (docs/disruption-budget.md, "Determinism").
        """
        self._arm()
        while not history_is_long(limit) and self._move_to is None:
            if self._inbox or self._dirty or self._due:
                await self._tick()
                self._arm()
                continue
            ticker = self._ticker
            # `_dirty`: the `acquire` update of requesters from before SIGNAL_PATCH changes the book itself.
            await workflow.wait_condition(lambda: bool(self._inbox) or self._dirty or history_is_long(limit) or
                                          (ticker is not None and ticker.done()))  # fmt: skip
            if ticker is not None and ticker.done():
                if self._ticker_kind == "idle" and not self._inbox and workflow.all_handlers_finished():
                    return True
                self._due = True  # the periodic look (a fired idle timer that cannot close: it is started anew)
        return False

    def _idle(self) -> bool:
        """Nothing leased, waiting or tripped: a run may close (a tripped breaker keeps the entity running:
        visible in the list, and answering the sweep's query)."""
        return not self._book.leases and not self._book.queue and not self._book.breaker.tripped

    def _arm(self) -> None:
        """Keep the one periodic timer that fits the book: re-check while requests wait, check the holders
        while leases are held, close when idle; none while only the tripped breaker keeps the run."""
        kind = "check" if self._book.queue else "liveness" if self._book.leases else "idle" if self._idle() else ""
        if self._ticker is not None and not self._ticker.done() and kind == self._ticker_kind:
            return
        if self._ticker is not None and not self._ticker.done():
            self._ticker.cancel()
        self._ticker, self._ticker_kind = None, kind
        wake = self._inp.idle_close_after if kind == "idle" else self._wake_in()
        if wake is not None:
            summary = "close while idle" if kind == "idle" else "recheck the cluster and the holders"
            self._ticker = asyncio.ensure_future(workflow.sleep(max(wake, MIN_WAIT), summary=summary))

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
        """Decide what waits, and check the holders when a periodic look is due (on EVENT_CLOCK_PATCH: when
        the ticker fired; before it: by the clock)."""
        self._apply_received()
        self._dirty = False
        periodic, self._due = self._due, False
        now, inp = workflow.now(), self._inp
        if self._book.queue:
            await self._decide()  # tells every requester owed a decision
        elif any(lease.answer for lease in self._everyone()):  # a granted lease asked for again
            await self._notify([])
        waiting = bool(self._book.queue)
        if self._event_clock:
            due = periodic or self._liveness_at is None
        else:  # runs from before EVENT_CLOCK_PATCH replay as they ran
            interval = inp.check_interval if waiting else inp.liveness_interval
            due = self._liveness_at is None or now - self._liveness_at >= interval
        if (waiting or self._book.leases) and due:
            await self._check_holders()
        self._changed()

    async def _decide(self) -> None:
        """Read the cluster once, grant what fits in FIFO order, tell the requesters."""
        limits = self._book.limits
        read = UnavailableRequest(cluster=self._inp.cluster)
        if limits.any:  # only then: the reads of runs without limits replay as they ran
            nodes = sorted({lease.node for lease in self._everyone()})
            read = read.model_copy(update={"topology": limits.topology, "nodes": nodes,
                                           "gangs": limits.gangs is not None})  # fmt: skip
        try:
            self._avail = await self._activity(
                KubeActivities.node_availability, read, f"nodes out of service in {self._inp.cluster}"
            )
            self._placed = read.topology is not None
            self._error = ""
        except ActivityError as err:  # fail closed: nothing is granted without a fresh read
            self._error = f"reading the cluster failed: {err.cause or err}"
            self._checked_at = workflow.now()
            self._decisions += 1
            return
        # The read's own time, recorded with its result, is what the breaker's windows are judged at.
        self._checked_at = (self._avail.read_at if self._event_clock else None) or workflow.now()
        tripped = self._book.breaker.tripped
        granted, refused = self._book.grant(self._avail, self._checked_at, breaker=self._breaker,
                                            control_plane=self._control_plane)  # fmt: skip
        self._refused += refused
        self._decisions += 1
        if self._book.breaker.tripped != tripped:
            self._breaker_changed(trip=True)
        await self._notify([g for g in granted if g.notify])

    async def _notify(self, granted: list[Lease]) -> None:
        """Signal the grants of update-path holders, one each, and every decision owed to a signal-path requester,
        one signal per requester (refusals too). A receiver whose run is gone loses its leases and requests."""
        owed: dict[str, list[Lease]] = {}
        refused, self._refused = self._refused, []
        for lease in self._everyone() + refused:
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
                self._drop(lease_key(lease.holder, lease.node), "recovered: the grant could not be delivered")
        for to in gone & set(owed):
            for lease in owed[to]:
                self._drop(lease_key(lease.holder, lease.node), f"recovered: requester {to} no longer runs")

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
                self._drop(lease_key(lease.holder, lease.node), f"recovered: holder {lease.holder} closed")

    async def _activity(self, method: Callable, arg: BaseModel, summary: str) -> Any:
        """A short read: a local activity (one event) on the signal protocol, an activity on runs from before."""
        if self._signals:
            return await workflow.execute_local_activity_method(method, arg, **API_CALL, summary=summary)
        return await workflow.execute_activity_method(method, arg, **API_CALL, summary=summary)

    # ------------------------------------------------------------ the book

    def _everyone(self) -> list[Lease]:
        return self._book.everyone()

    def _drop(self, key: str, note: str) -> Lease | None:
        lease = self._book.drop(key, note)
        if lease is not None:
            self._dirty = True  # room for whoever waits
        return lease

    # ------------------------------------------------------------ visibility

    def _allowed(self) -> int | None:
        return self._book.allowed(self._avail)

    def _out_of_service(self) -> dict[str, str]:
        out = dict(sorted((self._avail.unavailable if self._avail else {}).items()))
        for lease in self._book.leases.values():
            why = f"{lease.id} ({lease.holder})"
            out[lease.node] = f"{out[lease.node]}, {why}" if lease.node in out else why
        return out

    def _units_out(self) -> UnitsOut | None:
        """The NVLink domains and gangs out at the last read, when a limit is set and that read placed the nodes."""
        if not (self._book.limits.any and self._placed and self._avail):
            return None
        return UnitsOut(self._avail, list(self._book.leases.values()))

    def _units_view(self) -> dict[str, Any]:
        units = self._units_out()
        if units is None:
            return {}
        places = {node: units.describe(node) for node in self._out_of_service()}
        return {"domains_out": units.domains, "gangs_disrupted": units.gangs, "places": places}

    def _summary(self) -> str:
        total = self._avail.total if self._avail else None
        line = (f"budget {budget_text(self._book.budget)} ({self._book.budget_source}) = "
                f"{self._allowed() if total is not None else '?'} of {total if total is not None else '?'} nodes: "
                f"{len(self._out_of_service())} out of service, {len(self._book.leases)} leased, "
                f"{len(self._book.queue)} waiting")  # fmt: skip
        limits, units = self._book.limits, self._units_out()
        if limits.nvlink_domains is not None:
            line += (f"; NVLink domains out: {len(units.domains) if units else '?'} of {limits.nvlink_domains}"
                     + (f" ({', '.join(f'{d}: {len(n)} nodes' for d, n in sorted(units.domains.items()))})"
                        if units and units.domains else ""))  # fmt: skip
        if limits.gangs is not None:
            line += (f"; gangs disrupted: {len(units.gangs) if units else '?'} of {limits.gangs}"
                     + (f" ({', '.join(sorted(units.gangs))})" if units and units.gangs else ""))  # fmt: skip
        if self._book.queue:
            nxt = self._book.queue[0]
            line += f" (next: {nxt.node} for {nxt.holder}{f', {nxt.note}' if nxt.note else ''})"
        if self._book.breaker.tripped:
            line = f"**{self._book.breaker.refusal()}**\n\n{line}"
        return line + (f"; {self._error}" if self._error else "")

    def _breaker_changed(self, trip: bool = False) -> None:
        """The breaker's phase in the workflow list, and its gauge; `trip`: it just tripped (counted)."""
        b, cluster = self._book.breaker, {"cluster": self._inp.cluster}
        publish_phase(TRIPPED_PHASE if b.tripped else SERVING_PHASE)
        meter = workflow.metric_meter()
        meter.create_gauge(TRIPPED_GAUGE, "1: the cluster's remediation circuit breaker is tripped").set(
            int(b.tripped), cluster
        )
        if trip:
            meter.create_counter(TRIPS_COUNTER, "Times the remediation circuit breaker tripped").add(1, cluster)

    def _changed(self) -> None:
        workflow.set_current_details(self._summary())
