"""The requester side of the disruption budget: the lease models, ``acquire_lease`` / ``release_lease``, and
``acquire_leases`` / ``release_leases`` for a group of nodes taken out of service together (a rack).

Any workflow that takes a node out of service (a rollout batch for its ``NodeUpdate`` children,
``NodeMaintenance``, a remediation) asks the cluster's ``DisruptionBudget`` entity for a lease here;
workflows/budget/disruption_budget.py describes the entity and the protocol (signals, their event costs, task
queues). No workflow is defined here: the worker passes this module through the sandbox once
(worker/registry.py), so a run that holds a lease never imports the entity's module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from activities.entities import EntityActivities, EntityStart, EntityUpdate, WorkflowSignal, WorkflowSignals
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from workflows.budget.breaker import BreakerSettings
from workflows.budget.budget import Budget
from workflows.common import priorities
from workflows.common import search_attributes as sa

GRANTED_SIGNAL = "disruption_budget_granted"  # update path: one grant per signal, to its holder
DECISIONS_SIGNAL = "disruption_budget_decisions"  # signal path: every decision owed to one requester
REQUEST_SIGNAL = "request_leases"
RELEASE_SIGNAL = "release_leases"
LEASE_PATCH = "disruption-budget-lease"  # workflow.patched() id guarding the lease in NodeUpdate/NodeMaintenance
SIGNAL_PATCH = "disruption-budget-signals"  # workflow.patched() id: the signal protocol, entity and requesters
REPOLL = timedelta(minutes=5)  # a waiting requester asks again this often, in case its entity was terminated
# Update path: the update answers once decided; a retry attaches to the same update.
BUDGET_CALL: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(seconds=15),
    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                             maximum_interval=timedelta(seconds=30)),
)  # fmt: skip
# Signal path: a few short calls as a local activity; a worker killed during one holds the run up for a
# workflow task timeout (10 s), then another worker sends them again (receivers de-duplicate).
SIGNAL_CALL: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(seconds=10),
    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                             maximum_interval=timedelta(seconds=10)),
)  # fmt: skip


GROUP_DESCRIPTION = (
    "Requests of one requester with the same group are granted together in one decision, or not at all "
    "(a rack's nodes: workflows/budget/book.py `grant`)."
)


def no_group(group: str | None) -> bool:
    """Left out of a payload when unset: a request or a decision without one is what a build from before groups
    sends and reads (its models refuse unknown fields; the entity moves to a new build before pinned requesters)."""
    return group is None


def budget_workflow_id(cluster: str) -> str:
    return f"disruption-budget/{cluster}"


class Lease(StrictModel):
    """A "node out of service" lease, or a request for one waiting its turn."""

    id: str
    cluster: str
    node: str
    holder: str = Field(description="Workflow ID of the run that holds (or waits for) the lease.")
    reason: str = ""
    state: Literal["queued", "granted", "released", "refused"] = Field(
        "queued", description="refused: a remediation's request while the cluster's circuit breaker is tripped."
    )
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
    remediation: BreakerSettings | None = Field(
        None, description="Asked for by automated remediation: the circuit breaker's settings it is judged by."
    )
    own_budget: Budget | None = Field(
        None, description="The budget its requester stated: its leases stay within it, inside the cluster's."
    )
    domain: str | None = Field(
        None, description="Granted under an NVLink-domain or gang limit: its node's NVLink domain at the grant."
    )
    gangs: list[str] = Field(
        default_factory=list, description="Granted under such a limit: the gangs its node ran at the grant."
    )
    group: str | None = Field(None, description=GROUP_DESCRIPTION, exclude_if=no_group)


class LeaseRequest(StrictModel):
    node: str
    holder: str = Field(min_length=1, description="The workflow ID that will hold the lease.")
    reason: str = ""
    budget: Budget | None = Field(None, description="Update path: the requester's own budget (see LeaseRequests).")
    request_id: str = Field("", description="Signal path: set by the requester, new for each time it asks afresh.")
    remediation: BreakerSettings | None = Field(
        None,
        description="Set by automated remediation (workflows/budget/breaker.py): the circuit breaker's "
        "settings its node is judged by; the request is refused while the breaker is tripped.",
    )
    group: str | None = Field(None, description=GROUP_DESCRIPTION, exclude_if=no_group)

    _node = field_validator("node")(validate_object_name)


class LeaseRequests(StrictModel):
    """The ``request_leases`` signal: one requester asks for leases on one or many nodes."""

    reply_to: str = Field(min_length=1, description="The requester's workflow ID: decisions are signalled there.")
    task_queue: str = Field(min_length=1, description="The requester's task queue: the entity follows it.")
    budget: Budget | None = Field(
        None,
        description="The requester's own budget: its leases stay within it, inside the cluster's, which only an "
        "operator sets (entity runs from before OPERATOR_BUDGET_PATCH took it as the cluster's if it had none).",
    )
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
        self.sender: asyncio.Task | None = None

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

    async def release(self, cluster: str, *releases: LeaseRelease) -> None:
        """Send the releases (or withdrawals), in one signal, and wait until the entity has them."""
        posted = 0
        for release in releases:
            posted = self._post(cluster, RELEASE_SIGNAL, release, None)
        await workflow.wait_condition(lambda: self.sent >= posted)

    def _post(self, cluster: str, signal: str, item: BaseModel, budget: Budget | None) -> int:
        self.outbox.append((cluster, signal, item, budget))
        self.posted += 1
        if not self.sending:
            self.sending = True
            self.sender = asyncio.create_task(self._send())  # kept: the loop holds tasks only weakly
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
                    except TimeoutError:  # in case the entity was terminated: it is started afresh
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
                            task_queue=info.task_queue, keywords={sa.CLUSTER.name: cluster},
                            priority_key=priorities.OPERATOR.priority_key)  # fmt: skip
        signals.append(WorkflowSignal(workflow_id=budget_workflow_id(cluster), signal=signal,
                                      payload=message.model_dump(mode="json"), start=start))  # fmt: skip
    return signals


def _requester() -> _Requester:
    instance = workflow.instance()
    requester = getattr(instance, "_millwright_leases", None)
    if requester is None:
        requester = _Requester()
        instance._millwright_leases = requester
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
            entity=f"disruption budget of {cluster}", priority_key=priorities.OPERATOR.priority_key,
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
    remediation: BreakerSettings | None = None,
) -> Lease | None:
    """Wait for the cluster's disruption budget to let `node` out of service; returns the granted lease.

    `remediation` (automated remediation only): the request counts towards the cluster's circuit breaker, with
    these settings; a lease in state `refused` is returned, with the reason in its note, when the breaker is (or
    this request makes it) tripped.

    `holder` defaults to this run's workflow ID; another ID (a child this run will start with the lease) holds
    it while this run asks and hears the decisions. Asking again with the same holder and node returns the same
    lease. `budget` is this run's own: its leases stay within it (the cluster's budget is the operator's).
    `waiting(lease)` is called each
    time the request is (still) queued, with its place. When `cancelled()` turns true while waiting, the request
    is withdrawn and None returned; while `paused()` is true it is withdrawn and asked afresh on resume (a paused
    run holds no place). Runs on the update path (started before SIGNAL_PATCH) ignore `paused`.
    """
    holder = holder or workflow.info().workflow_id
    requester = _requester()
    if requester.signals is None:
        requester.signals = workflow.patched(SIGNAL_PATCH)
    request = LeaseRequest(node=node, holder=holder, reason=reason, remediation=remediation)
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
            if ask.granted or ask.lease.state == "refused":
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
    while lease.state not in ("granted", "refused"):
        if waiting is not None:
            waiting(lease)
        wanted = lease.id
        with contextlib.suppress(TimeoutError):  # a re-poll, not a failure
            await workflow.wait_condition(
                lambda: wanted in requester.granted or cancelled(), timeout=REPOLL,
                timeout_summary=f"waiting for the disruption budget of {cluster} ({request.node})",
            )  # fmt: skip
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


async def acquire_leases(
    cluster: str,
    nodes: list[str],
    *,
    group: str,
    holder: str | None = None,
    reason: str = "",
    budget: Budget | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    waiting: Callable[[Lease], None] | None = None,
    remediation: BreakerSettings | None = None,
) -> list[Lease]:
    """Wait for the cluster's disruption budget to let all of `nodes` out of service together: one request per
    node, all in one signal, as `group`, which the entity grants in one decision or not at all
    (docs/disruption-budget.md, "Group leases"). Returns the leases once decided: all `granted`, or all `refused`
    (with `remediation`, by the circuit breaker, counted once for the group); [] when `cancelled()` turned true
    while waiting (every request withdrawn, in one signal). `waiting(lease)` is called with a member's lease each
    time the group is (still) queued: its note says why the group waits. `holder`, `reason`, `budget` and
    `remediation` as for `acquire_lease`, alike for every node. The signal path only: a run started before
    SIGNAL_PATCH cannot ask for a group.
    """
    if not nodes or len(set(nodes)) != len(nodes):
        raise ApplicationError(f"group {group} of the disruption budget of {cluster} needs distinct nodes, "
                               f"got {nodes}", type="LeaseGroupInvalid", non_retryable=True)  # fmt: skip
    holder = holder or workflow.info().workflow_id
    requester = _requester()
    if requester.signals is None:
        requester.signals = workflow.patched(SIGNAL_PATCH)
    _on_signal_path(requester, f"group {group}")
    asks = [requester.ask(cluster, LeaseRequest(node=node, holder=holder, reason=reason, remediation=remediation,
                                                group=group, request_id=str(workflow.uuid4())), budget)
            for node in nodes]  # fmt: skip
    seen = 0
    while True:
        await workflow.wait_condition(lambda: sum(ask.decisions for ask in asks) != seen or cancelled())
        if cancelled():
            for ask in asks:
                requester.forget(ask)
            await requester.release(cluster, *(LeaseRelease(node=node, holder=holder, reason="withdrawn while waiting")
                                               for node in nodes))  # fmt: skip
            return []
        seen = sum(ask.decisions for ask in asks)
        decided = [ask.lease for ask in asks if ask.lease is not None and ask.lease.state in ("granted", "refused")]
        if len(decided) == len(asks):
            for ask in asks:
                requester.forget(ask)
            return decided
        queued = next((ask.lease for ask in asks if ask.lease is not None and ask.lease.state == "queued"), None)
        if waiting is not None and queued is not None:
            waiting(queued)


async def release_leases(cluster: str, nodes: list[str], holder: str | None = None, reason: str = "") -> None:
    """Return the leases on `nodes` (a group's, or any), or withdraw their requests, in one signal, once the entity
    has it. The signal path only, as `acquire_leases`."""
    holder = holder or workflow.info().workflow_id
    requester = _requester()
    _on_signal_path(requester, f"the leases on {', '.join(nodes)}")
    await requester.release(cluster, *(LeaseRelease(node=node, holder=holder, reason=reason) for node in nodes))


def _on_signal_path(requester: _Requester, what: str) -> None:
    if requester.signals is False:
        raise ApplicationError(
            f"{what}: this run asks the disruption budget by Workflow Update (it started before {SIGNAL_PATCH}); "
            "leases for several nodes at once are asked for and returned on the signal path only",
            type="LeaseGroupOnUpdatePath", non_retryable=True,
        )  # fmt: skip
