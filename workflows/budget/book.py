"""The disruption budget's book of leases: who holds which node, who waits in which order, and the grant rule.

Plain data and rules with no Temporal call, so that the rules are tested without a server
(tests/workflows/budget/test_lease_book.py); the ``DisruptionBudget`` entity (workflows/budget/disruption_budget.py) reads
the cluster, feeds the book what its signals and reads carry, and tells the requesters what it decided.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import Field

from activities.kube.models import NodeAvailability
from activities.models import StrictModel
from workflows.budget.breaker import Breaker
from workflows.budget.budget import Budget, ceiling
from workflows.budget.control_plane import DEFAULT_AT_ONCE, control_plane_wait
from workflows.budget.leases import Lease, LeaseRequest, LeaseRequests
from workflows.budget.units import UnitLimits, UnitsOut

DEFAULT_BUDGET = Budget(percent=10)


def lease_key(holder: str, node: str) -> str:
    return f"{holder}|{node}"


def budget_text(budget: Budget) -> str:
    return f"{budget.count} nodes" if budget.count is not None else f"{budget.percent}%"


def requester(lease: Lease) -> str:
    """Who asked: the run told the decisions (a batch, for its children), else the holder (the update path)."""
    return lease.reply_to or lease.holder


@dataclass
class _Decision:
    """One grant round's running account: the read it decides on, what is out of service, each requester's leases,
    whether a request waits for the node count (nobody who costs a node passes it), and what it decided."""

    avail: NodeAvailability
    now: datetime
    allowed: int
    out: set[str]
    units: UnitsOut | None
    holding: Counter[str]
    blocked: bool = False
    granted: list[Lease] = field(default_factory=list)
    refused: list[Lease] = field(default_factory=list)


class BudgetBook(StrictModel):
    """What the entity remembers, carried across continue-as-new."""

    budget: Budget = Field(default_factory=lambda: DEFAULT_BUDGET.model_copy())
    budget_source: str = "default"
    leases: dict[str, Lease] = Field(default_factory=dict, description="Granted, by holder + node.")
    queue: list[Lease] = Field(default_factory=list, description="Waiting, first come first served.")
    next_id: int = 1
    breaker: Breaker = Field(default_factory=Breaker, description="The cluster's remediation circuit breaker.")
    control_plane_at_once: int = Field(
        DEFAULT_AT_ONCE, ge=1, description="Control-plane nodes allowed out of service at once, whatever the budget."
    )
    limits: UnitLimits = Field(
        default_factory=UnitLimits, description="NVLink domains and gangs allowed out at once, beside the budget."
    )

    def everyone(self) -> list[Lease]:
        """Leases granted, then requests waiting, in order."""
        return list(self.leases.values()) + self.queue

    def find(self, key: str) -> Lease | None:
        return self.leases.get(key) or next((q for q in self.queue if lease_key(q.holder, q.node) == key), None)

    def allowed(self, avail: NodeAvailability | None) -> int | None:
        """Nodes allowed out of service at once, at the read `avail` (None: not read yet)."""
        return ceiling(self.budget, avail.total) if avail else None

    def own_budgets(self, avail: NodeAvailability | None) -> dict[str, str]:
        """Each requester that stated its own budget: its leases and waiting requests within it (for `state`)."""
        mine: dict[str, list[Lease]] = {}
        for lease in self.everyone():
            if lease.own_budget is not None:
                mine.setdefault(requester(lease), []).append(lease)
        lines = {}
        for who, leases in sorted(mine.items()):
            own = leases[-1].own_budget
            assert own is not None
            allows = f" = {ceiling(own, avail.total)}" if avail else ""
            held = sum(1 for lease in leases if lease.state == "granted")
            lines[who] = f"its own budget {budget_text(own)}{allows}: {held} leased, {len(leases) - held} waiting"
        return lines

    def adopt_budget(self, budget: Budget | None, requester: str) -> None:
        """Runs from before OPERATOR_BUDGET_PATCH only: the first budget a requester states is the cluster's,
        until an operator sets one."""
        if budget is not None and self.budget_source == "default":
            self.budget, self.budget_source = budget, f"first requester {requester}"

    def forget_requester_budget(self) -> None:
        """A budget the first requester set (runs from before OPERATOR_BUDGET_PATCH) is no cluster's setting:
        the default again, until an operator declares one."""
        if self.budget_source.startswith("first requester"):
            self.budget, self.budget_source = DEFAULT_BUDGET.model_copy(), "default"

    def take_requests(self, msg: LeaseRequests, cluster: str, now: datetime, *, own_budgets: bool = True) -> None:
        """File a requester's requests: a new one queues last; one asked again keeps its lease or its place.

        `own_budgets` (OPERATOR_BUDGET_PATCH): the budget the requester states caps its own leases; without,
        the first one stated becomes the cluster's."""
        if not own_budgets:
            self.adopt_budget(msg.budget, msg.reply_to)
        for req in msg.requests:
            lease = self.find(lease_key(req.holder, req.node))
            if lease is None:
                lease = self.new_lease(req, cluster, now)
                self.queue.append(lease)
            elif lease.request_id != req.request_id:
                # A new request for the same holder and node takes the lease (or the place) over: asking again
                # returns the same lease. Its holder's run is about to start again, so it has not been seen yet.
                lease.holder_seen = False
            lease.request_id, lease.reply_to, lease.answer = req.request_id, msg.reply_to, True
            lease.remediation, lease.group = req.remediation, req.group  # asked again: judged as asked now
            lease.own_budget = msg.budget if own_budgets else None

    def new_lease(self, req: LeaseRequest, cluster: str, now: datetime) -> Lease:
        lease = Lease(id=f"lease-{self.next_id}", cluster=cluster, node=req.node, holder=req.holder,
                      reason=req.reason, requested_at=now, remediation=req.remediation, group=req.group)  # fmt: skip
        self.next_id += 1
        return lease

    def drop(self, key: str, note: str) -> Lease | None:
        """Take a lease back, or a request out of the queue; the one dropped, or None."""
        lease = self.leases.pop(key, None)
        if lease is None:
            lease = next((q for q in self.queue if lease_key(q.holder, q.node) == key), None)
            if lease is not None:
                self.queue.remove(lease)
        if lease is not None:
            lease.state, lease.position, lease.note, lease.answer = "released", None, note, False
        return lease

    def grant(
        self, avail: NodeAvailability, now: datetime, *, breaker: bool, control_plane: bool
    ) -> tuple[list[Lease], list[Lease]]:
        """Grant what fits, in FIFO order, at the read `avail` made at `now`: (granted, refused by the breaker).

        A lease is granted while the nodes out of service for any reason (leased, cordoned, NotReady: one count
        per node) stay within the budget; a node already out costs nothing. Nobody who costs a node overtakes a
        waiting request, except past a control-plane node that waits for another (`control_plane`), or past a
        request its requester's own budget holds (`Lease.own_budget`: its leases, whether or not they cost a node,
        stay within it). With `breaker`, a remediation's request is counted by the circuit breaker, or refused.

        With `limits`, a request that costs a node is also granted only while the NVLink domains with nodes out of
        service and the gangs disrupted stay within them; one held by such a limit holds nobody up: a later
        request that adds no domain (or gang) is within it.

        A group (`Lease.group`: one requester's requests with the same group) is decided at its first member's
        place in the queue, whole: granted in this decision, or waiting, or refused, every member alike
        (`_grant_group`)."""
        decision = _Decision(avail, now, self.allowed(avail) or 0,
                             set(avail.unavailable) | {lease.node for lease in self.leases.values()},
                             UnitsOut(avail, list(self.leases.values())) if self.limits.any else None,
                             Counter(requester(lease) for lease in self.leases.values()))  # fmt: skip
        groups: set[tuple[str, str]] = set()
        for lease in list(self.queue):
            if lease.group is not None:
                group = (requester(lease), lease.group)
                if group not in groups:  # its later members were decided with it
                    groups.add(group)
                    members = [q for q in self.queue if (requester(q), q.group) == group]
                    self._grant_group(members, decision, breaker=breaker, control_plane=control_plane)
                continue
            remediation = lease.remediation if breaker else None
            if remediation is not None and self.breaker.tripped:  # refused at once, and holds nobody up
                decision.refused.append(self._refuse(lease, self.breaker.admit(lease.node, lease.holder, avail.total,
                                                                               remediation, now) or ""))  # fmt: skip
                continue
            who = requester(lease)
            if lease.own_budget is not None and decision.holding[who] >= ceiling(lease.own_budget, avail.total):
                # Held by its requester's own budget, not the cluster's: it holds nobody else up.
                lease.note = (f"waiting: its requester {who} holds {decision.holding[who]} leases, all its own "
                              "budget allows")  # fmt: skip
                continue
            out, allowed = decision.out, decision.allowed
            costs = lease.node not in out
            if costs and (decision.blocked or len(out) + 1 > allowed):
                # First come, first served: nobody who costs a node overtakes a waiting request.
                decision.blocked = True
                lease.note = f"waiting: {len(out)} of {allowed} allowed nodes out of service"
                continue
            held = (control_plane_wait(lease.node, out, set(avail.control_plane), self.control_plane_at_once)
                    if costs and control_plane else None)  # fmt: skip
            if held is None and costs and decision.units is not None:
                held = decision.units.wait(lease, self.limits)
            if held is not None:  # waits for a control-plane node or a unit limit: later requests may pass
                lease.note = held
                continue
            if remediation is not None:  # the breaker counts a node when remediation takes it, never while it waits
                why = self.breaker.admit(lease.node, lease.holder, avail.total, remediation, now)
                if why is not None:
                    decision.refused.append(self._refuse(lease, why))
                    continue
            self._take(lease, decision)
        for i, lease in enumerate(self.queue, 1):
            lease.position = i
        return decision.granted, decision.refused

    def _grant_group(self, members: list[Lease], decision: _Decision, *, breaker: bool, control_plane: bool) -> None:
        """Decide a group as one request for all its members' nodes: the same rules as one lease (the nodes it
        newly takes out against the node count, first come first served; its requester's own budget; the
        control-plane rule and the unit limits, as if every member were granted; the breaker, which takes or
        refuses every node in one decision), and every member takes the same decision."""
        first, size = members[0], len(members)
        name, who, total = first.group, requester(first), decision.avail.total
        remediated = [m for m in members if m.remediation is not None] if breaker else []

        def wait(why: str) -> None:
            for member in members:
                member.note = f"waiting: the {size} nodes of group {name}{why}"

        def refuse(why: str) -> None:
            decision.refused.extend(self._refuse(member, why) for member in members)

        if remediated and self.breaker.tripped:  # refused at once, and holds nobody up
            refuse(self._admit_group(remediated, total, decision.now) or "")
            return
        if first.own_budget is not None and decision.holding[who] + size > ceiling(first.own_budget, total):
            wait(f" need {size} of its requester {who}'s own budget, which allows "
                 f"{ceiling(first.own_budget, total)}; it holds {decision.holding[who]}")  # fmt: skip
            return
        out, allowed = decision.out, decision.allowed
        new = [node for node in dict.fromkeys(m.node for m in members) if node not in out]
        if new and (decision.blocked or len(out) + len(new) > allowed):
            decision.blocked = True  # first come, first served, as for one request
            wait(f" need {len(new)} more out of service; {len(out)} of {allowed} allowed"
                 + (" (more than the budget allows at all, until an operator raises it)" if len(new) > allowed else ""))  # fmt: skip
            return
        held = self._group_held(members, decision, control_plane)
        if held is not None:  # a control-plane node or a unit limit: later requests may pass
            wait(f": {held.removeprefix('waiting: ')}")
            return
        if remediated:
            why = self._admit_group(remediated, total, decision.now)
            if why is not None:
                refuse(why)
                return
        for member in members:
            self._take(member, decision)

    def _group_held(self, members: list[Lease], decision: _Decision, control_plane: bool) -> str | None:
        """Why the control-plane rule or a unit limit holds the group, its members tried one after another on a
        copy of what is out; None: all of them fit."""
        out = set(decision.out)
        units = decision.units.trial() if decision.units is not None else None
        for member in members:
            if member.node in out:
                continue
            held = (control_plane_wait(member.node, out, set(decision.avail.control_plane), self.control_plane_at_once)
                    if control_plane else None)  # fmt: skip
            if held is None and units is not None:
                held = units.wait(member, self.limits)
            if held is not None:
                return held
            out.add(member.node)
            if units is not None:
                units.take(member)
        return None

    def _admit_group(self, remediated: list[Lease], total: int, now: datetime) -> str | None:
        """The breaker's one decision on a group's remediation: judged by its first member's settings."""
        settings = remediated[0].remediation
        assert settings is not None
        return self.breaker.admit_all([m.node for m in remediated], remediated[0].holder, total, settings, now)

    def _take(self, lease: Lease, decision: _Decision) -> None:
        """Grant a waiting request: its node is out of service from now on."""
        costs = lease.node not in decision.out
        self.queue.remove(lease)
        lease.state, lease.granted_at, lease.position = "granted", decision.now, None
        lease.note = "" if costs else "the node was already out of service"
        lease.answer = lease.reply_to is not None
        self.leases[lease_key(lease.holder, lease.node)] = lease
        if decision.units is not None:
            decision.units.record(lease)
        decision.out.add(lease.node)
        decision.holding[requester(lease)] += 1
        decision.granted.append(lease)

    def _refuse(self, lease: Lease, note: str) -> Lease:
        self.queue.remove(lease)
        lease.state, lease.position, lease.note = "refused", None, note
        lease.answer = lease.reply_to is not None
        return lease
