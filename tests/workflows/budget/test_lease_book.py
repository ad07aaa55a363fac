"""The lease book's rules without a server: FIFO grants within the budget, a node already out costs nothing,
the control-plane rule, the breaker, idempotent requests and drops, a requester's own budget
(workflows/budget/book.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from activities.kube.models import NodeAvailability
from workflows.budget.book import BudgetBook, lease_key
from workflows.budget.breaker import BreakerSettings
from workflows.budget.budget import Budget
from workflows.budget.leases import LeaseRequest, LeaseRequests

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NODES = [f"node-{i:02d}" for i in range(1, 11)]


def ask(
    book: BudgetBook, *nodes: str, holder: str = "", remediation: BreakerSettings | None = None,
    requester: str = "requester", budget: Budget | None = None, own_budgets: bool = True,
) -> None:  # fmt: skip
    requests = [LeaseRequest(node=n, holder=holder or f"h/{n}", request_id=f"r/{n}", remediation=remediation)
                for n in nodes]  # fmt: skip
    msg = LeaseRequests(reply_to=requester, task_queue="q", budget=budget, requests=requests)
    book.take_requests(msg, "lab", T0, own_budgets=own_budgets)


def cluster(unavailable: dict[str, str] | None = None, control_plane: tuple[str, ...] = ()) -> NodeAvailability:
    return NodeAvailability(total=len(NODES), unavailable=unavailable or {}, control_plane=list(control_plane))


def test_grants_in_order_within_the_budget_and_queues_the_rest():
    book = BudgetBook(budget=Budget(count=2))
    ask(book, "node-01", "node-02", "node-03")
    granted, refused = book.grant(cluster(), T0, breaker=True, control_plane=True)
    assert [g.node for g in granted] == ["node-01", "node-02"] and refused == []
    assert [(q.node, q.position) for q in book.queue] == [("node-03", 1)]
    assert book.queue[0].note == "waiting: 2 of 2 allowed nodes out of service"


def test_a_node_already_out_of_service_costs_nothing_and_nobody_overtakes_a_waiting_request():
    book = BudgetBook(budget=Budget(count=1))
    ask(book, "node-02", "node-03", "node-01")
    granted, _ = book.grant(cluster({"node-01": "cordoned"}), T0, breaker=True, control_plane=True)
    # node-02 and node-03 would each cost a node beyond the 1 allowed; node-01 is out already.
    assert [g.node for g in granted] == ["node-01"]
    assert granted[0].note == "the node was already out of service"
    assert [q.node for q in book.queue] == ["node-02", "node-03"]


def test_asking_again_keeps_the_lease_and_dropping_frees_room():
    book = BudgetBook(budget=Budget(count=1))
    ask(book, "node-01")
    [lease], _ = book.grant(cluster(), T0, breaker=True, control_plane=True)
    ask(book, "node-01")
    assert book.find(lease_key("h/node-01", "node-01")) is lease and book.next_id == 2
    ask(book, "node-02")
    assert book.grant(cluster(), T0, breaker=True, control_plane=True)[0] == []
    assert book.drop(lease_key("h/node-01", "node-01"), "released").state == "released"
    assert book.drop(lease_key("h/node-01", "node-01"), "released") is None  # idempotent
    assert [g.node for g in book.grant(cluster(), T0, breaker=True, control_plane=True)[0]] == ["node-02"]


def test_a_control_plane_node_waits_for_another_without_holding_up_workers():
    book = BudgetBook(budget=Budget(count=5))
    ask(book, "node-01", "node-02", "node-05")
    granted, _ = book.grant(cluster(control_plane=("node-01", "node-02", "node-03")), T0, breaker=True,
                            control_plane=True)  # fmt: skip
    assert [g.node for g in granted] == ["node-01", "node-05"]
    assert "control-plane node node-02 waits" in book.queue[0].note
    off = BudgetBook(budget=Budget(count=5))
    ask(off, "node-01", "node-02")
    assert len(off.grant(cluster(control_plane=("node-01", "node-02")), T0, breaker=True, control_plane=False)[0]) == 2


def test_remediation_past_its_share_trips_the_breaker_and_is_refused():
    book = BudgetBook(budget=Budget(count=10))
    settings = BreakerSettings(max_percent=20, window=timedelta(minutes=5))
    ask(book, "node-01", "node-02", "node-03", remediation=settings)
    granted, refused = book.grant(cluster(), T0, breaker=True, control_plane=True)
    assert [g.node for g in granted] == ["node-01", "node-02"] and [r.node for r in refused] == ["node-03"]
    assert book.breaker.tripped and refused[0].state == "refused"
    # Without the breaker (runs from before it), remediation is granted like anything else.
    plain = BudgetBook(budget=Budget(count=10))
    ask(plain, "node-01", "node-02", "node-03", remediation=settings)
    assert len(plain.grant(cluster(), T0, breaker=False, control_plane=True)[0]) == 3


@given(
    count=st.integers(1, 6),
    down=st.sets(st.sampled_from(NODES), max_size=4),
    asked=st.lists(st.sampled_from(NODES), min_size=1, max_size=10, unique=True),
)
def test_never_more_out_of_service_than_allowed_unless_already_out(count, down, asked):
    book = BudgetBook(budget=Budget(count=count))
    ask(book, *asked)
    avail = cluster({n: "NotReady" for n in down})
    granted, _ = book.grant(avail, T0, breaker=True, control_plane=True)
    out = set(down) | {g.node for g in granted}
    assert len(out) <= max(count, len(down))
    # FIFO: every granted request that cost a node came before the first one still waiting that costs one.
    waiting = [q.node for q in book.queue]
    if waiting:
        first_waiting = asked.index(waiting[0])
        assert all(asked.index(g.node) < first_waiting for g in granted if g.node not in down)
    assert [q.position for q in book.queue] == list(range(1, len(book.queue) + 1))


def test_a_requesters_budget_caps_its_own_leases_and_never_sets_the_clusters():
    book = BudgetBook()  # the default: 10% of 10 nodes = 1, until an operator declares one
    ask(book, "node-01", "node-02", requester="rollout-a", budget=Budget(count=5))
    assert book.budget == Budget(percent=10) and book.budget_source == "default"
    assert [g.node for g in book.grant(cluster(), T0, breaker=True, control_plane=True)[0]] == ["node-01"]
    book.budget, book.budget_source = Budget(count=4), "operator sre: wider"
    ask(book, "node-03", "node-04", requester="rollout-b", budget=Budget(count=1))
    granted, _ = book.grant(cluster(), T0, breaker=True, control_plane=True)
    # rollout-a takes its second node; rollout-b its one, and its second waits without holding up anyone else.
    assert [(g.node, g.reply_to) for g in granted] == [("node-02", "rollout-a"), ("node-03", "rollout-b")]
    assert [q.node for q in book.queue] == ["node-04"]
    assert book.queue[0].note == "waiting: its requester rollout-b holds 1 leases, all its own budget allows"
    assert book.own_budgets(cluster()) == {
        "rollout-a": "its own budget 5 nodes = 5: 2 leased, 0 waiting",
        "rollout-b": "its own budget 1 nodes = 1: 1 leased, 1 waiting",
    }
    ask(book, "node-05", requester="maintenance")  # states none: only the cluster's budget holds it
    assert [g.node for g in book.grant(cluster(), T0, breaker=True, control_plane=True)[0]] == ["node-05"]


def test_runs_from_before_the_operator_budget_took_the_first_requesters_and_forget_it_when_patched():
    book = BudgetBook()
    ask(book, "node-01", requester="rollout-a", budget=Budget(count=3), own_budgets=False)
    ask(book, "node-02", requester="rollout-b", budget=Budget(count=1), own_budgets=False)
    assert book.budget == Budget(count=3) and book.budget_source == "first requester rollout-a"
    assert all(q.own_budget is None for q in book.queue)
    book.forget_requester_budget()
    assert book.budget == Budget(percent=10) and book.budget_source == "default"
    book.budget, book.budget_source = Budget(count=2), "operator sre: two"
    book.forget_requester_budget()  # an operator's stays
    assert book.budget == Budget(count=2)


OWN = st.one_of(st.none(), st.integers(1, 4))


@given(
    cluster_budget=st.integers(1, 8),
    down=st.sets(st.sampled_from(NODES), max_size=3),
    own=st.fixed_dictionaries({"a": OWN, "b": OWN, "c": OWN}),
    asks=st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from(NODES)), min_size=1, max_size=10, unique_by=lambda t: t[1]
    ),
)
def test_no_requester_holds_more_than_its_own_budget_nor_the_cluster_more_than_its(cluster_budget, down, own, asks):
    book = BudgetBook(budget=Budget(count=cluster_budget), budget_source="operator sre: test")
    for who, node in asks:
        ask(book, node, requester=who, budget=Budget(count=own[who]) if own[who] else None)
    granted, _ = book.grant(cluster({n: "NotReady" for n in down}), T0, breaker=True, control_plane=True)
    assert book.budget == Budget(count=cluster_budget)  # nobody's request changed it
    assert len(set(down) | {g.node for g in granted}) <= max(cluster_budget, len(down))
    for who, limit in own.items():
        assert limit is None or sum(1 for g in granted if g.reply_to == who) <= limit
    # FIFO for the cluster's budget: a request held by its requester's own budget holds nobody up, and nobody
    # who costs a node is granted past one waiting for the cluster's budget.
    asked = [node for _who, node in asks]
    waiting = [q for q in book.queue if "allowed nodes out of service" in q.note]
    assert all(asked.index(q.node) > asked.index(g.node) for q in waiting for g in granted if g.node not in down)
