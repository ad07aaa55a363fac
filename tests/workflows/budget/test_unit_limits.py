"""The lease book's limits in NVLink domains and gangs, without a server (workflows/budget/units.py, book.grant):
each limit holds, a node already out costs nothing, a node without the clique label is its own domain unless its
rack says which domain it is in, the notes name the limit, and a request held by a limit holds up nobody who adds
nothing to it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from activities.kube.gang_reads import gang_disruptions
from activities.kube.models import NodeAvailability
from activities.kube.topology import CLIQUE_LABEL, TOPOGRAPH_ACCELERATOR_LABEL, Gang, TopologyLabels, place_of
from tests.workflows.budget.test_lease_book import NODES, T0, ask
from workflows.budget.book import BudgetBook
from workflows.budget.budget import Budget
from workflows.budget.models import BudgetChange
from workflows.budget.units import UnitLimits, UnitsOut

UUID_A = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
UUID_B = "0c4e2f1a-1111-4d2b-8d6e-3a9f5c2b7e10"
UUID_C = "e1d2c3b4-2222-4a5b-9c8d-7e6f5a4b3c2d"
# node-01..03 in domain A, 04..06 in B, 07..09 in C; node-10 has no clique label.
DOMAIN = {n: uuid for uuid, ns in ((UUID_A, NODES[0:3]), (UUID_B, NODES[3:6]), (UUID_C, NODES[6:9])) for n in ns}
# Gang train-a on node-01 and node-04; train-b on node-02; train-c on node-05 and node-07; node-03 runs no gang.
GANGS = {"node-01": ["kai:ml/train-a"], "node-04": ["kai:ml/train-a"], "node-02": ["kai:ml/train-b"],
         "node-05": ["kai:ml/train-c"], "node-07": ["kai:ml/train-c"]}  # fmt: skip


def placed(unavailable: dict[str, str] | None = None, disrupted: dict[str, str] | None = None) -> NodeAvailability:
    """The read a limited budget asks for: every node placed, its gangs, the gangs already disrupted."""
    places = {n: place_of(n, {"nvidia.com/gpu.clique": f"{DOMAIN[n]}.1"} if n in DOMAIN else {}) for n in NODES}
    return NodeAvailability(total=len(NODES), unavailable=unavailable or {}, places=places, gangs_on=GANGS,
                            disrupted_gangs=disrupted or {})  # fmt: skip


def grant(book: BudgetBook, avail: NodeAvailability) -> list[str]:
    return [g.node for g in book.grant(avail, T0, breaker=True, control_plane=True)[0]]


def test_the_domain_limit_holds_and_nodes_of_a_domain_already_out_pass():
    book = BudgetBook(budget=Budget(count=10), limits=UnitLimits(nvlink_domains=1))
    ask(book, "node-01", "node-04", "node-02")
    assert grant(book, placed()) == ["node-01", "node-02"]
    [waiting] = book.queue
    assert waiting.node == "node-04"
    assert waiting.note == (f"waiting: 1 of 1 allowed NVLink domains have nodes out of service (node-04 is in "
                            f"domain {UUID_B})")  # fmt: skip
    assert book.leases["h/node-01|node-01"].domain == UUID_A


def test_a_node_out_of_service_takes_its_domain_and_costs_nothing_itself():
    book = BudgetBook(budget=Budget(count=10), limits=UnitLimits(nvlink_domains=1, gangs=1))
    ask(book, "node-05", "node-04", "node-07")
    # node-05 is cordoned already: domain B and train-c are out; node-04 adds train-a, node-07 adds domain C.
    assert grant(book, placed({"node-05": "cordoned"}, {"kai:ml/train-c": "pods on node-05"})) == ["node-05"]
    assert book.leases["h/node-05|node-05"].note == "the node was already out of service"
    assert [q.node for q in book.queue] == ["node-04", "node-07"]
    assert "1 of 1 allowed gangs disrupted (node-04 runs kai:ml/train-a)" in book.queue[0].note
    assert "1 of 1 allowed NVLink domains" in book.queue[1].note


def test_a_node_without_the_clique_label_is_a_domain_of_its_own():
    book = BudgetBook(budget=Budget(count=10), limits=UnitLimits(nvlink_domains=1))
    ask(book, "node-10", "node-01")
    assert grant(book, placed()) == ["node-10"]
    assert book.leases["h/node-10|node-10"].domain == "node:node-10"
    assert book.queue[0].note.startswith("waiting: 1 of 1 allowed NVLink domains")
    other = BudgetBook(budget=Budget(count=10), limits=UnitLimits(nvlink_domains=1))
    ask(other, "node-01", "node-10")
    grant(other, placed())
    assert other.queue[0].note == ("waiting: 1 of 1 allowed NVLink domains have nodes out of service (node-10 has "
                                   "no nvidia.com/gpu.clique label: its own NVLink domain)")  # fmt: skip


def racks(labelled: dict[str, str], rack: dict[str, str]) -> NodeAvailability:
    """Every node placed: its clique label's ClusterUUID (`labelled`), its rack (`rack`)."""
    labels = {n: {CLIQUE_LABEL: f"{labelled[n]}.1"} if n in labelled else {} for n in NODES}
    for node, name in rack.items():
        labels[node][TOPOGRAPH_ACCELERATOR_LABEL] = name
    places = {n: place_of(n, labels[n]) for n in NODES}
    return NodeAvailability(total=len(NODES), unavailable={}, places=places)


RACK_A = ["node-01", "node-02", "node-03"]


def test_a_node_that_lost_its_label_counts_in_the_domain_its_rack_shows():
    # node-01 lost its label; node-02 and node-03, same rack, still show domain A.
    avail = racks({"node-02": UUID_A, "node-03": UUID_A, "node-04": UUID_B},
                  {**dict.fromkeys(RACK_A, "rack-a"), "node-04": "rack-b"})  # fmt: skip
    book = BudgetBook(budget=Budget(count=10), limits=UnitLimits(nvlink_domains=1))
    ask(book, "node-02", "node-01", "node-04")
    assert grant(book, avail) == ["node-02", "node-01"]
    assert book.leases["h/node-01|node-01"].domain == UUID_A
    # Once the whole rack lost the label, the leases keep it in domain A: one domain, and node-03 passes.
    ask(book, "node-03")
    assert grant(book, racks({"node-04": UUID_B}, {**dict.fromkeys(RACK_A, "rack-a"), "node-04": "rack-b"})) == [
        "node-03"
    ]
    assert book.queue[0].note == ("waiting: 1 of 1 allowed NVLink domains have nodes out of service (node-04 is in "
                                  f"domain {UUID_B})")  # fmt: skip


def test_the_gang_limit_holds_and_a_gang_already_disrupted_costs_nothing_more():
    book = BudgetBook(budget=Budget(count=10), limits=UnitLimits(gangs=2))
    ask(book, "node-01", "node-02", "node-05", "node-04", "node-03")
    # node-01 disrupts train-a, node-02 train-b; node-05 would add train-c; node-04 runs train-a (out already);
    # node-03 runs none.
    assert grant(book, placed()) == ["node-01", "node-02", "node-04", "node-03"]
    [waiting] = book.queue
    assert waiting.note == "waiting: 2 of 2 allowed gangs disrupted (node-05 runs kai:ml/train-c)"
    assert book.leases["h/node-01|node-01"].gangs == ["kai:ml/train-a"]


def test_a_gang_disrupted_elsewhere_counts_and_a_leased_gang_counts_after_its_pods_moved():
    book = BudgetBook(budget=Budget(count=10), limits=UnitLimits(gangs=2))
    ask(book, "node-01", "node-02")
    assert grant(book, placed(disrupted={"kai:ml/other": "below its minimum: 1 of 4 pods running"})) == ["node-01"]
    # Drained: train-a's pods left node-01, yet its lease keeps train-a disrupted while it is held.
    drained = placed(disrupted={"kai:ml/other": "below its minimum: 1 of 4 pods running"})
    drained.gangs_on = {n: g for n, g in GANGS.items() if n != "node-01"}
    assert grant(book, drained) == []
    assert book.queue[0].note == "waiting: 2 of 2 allowed gangs disrupted (node-02 runs kai:ml/train-b)"
    units = UnitsOut(drained, list(book.leases.values()))
    assert units.gangs["kai:ml/train-a"] == "runs on node-01, leased to h/node-01"


def test_a_request_held_by_a_limit_holds_up_nobody_who_adds_nothing_to_it():
    book = BudgetBook(budget=Budget(count=3), limits=UnitLimits(nvlink_domains=1))
    ask(book, "node-01", "node-04", "node-02", "node-03", "node-07")
    # node-04 waits for the domain limit; node-02 and node-03 (domain A) pass it within the node count;
    # node-07 waits for the node count (3 of 3) before the domain limit is asked.
    assert grant(book, placed()) == ["node-01", "node-02", "node-03"]
    assert [q.node for q in book.queue] == ["node-04", "node-07"]
    assert "NVLink domains" in book.queue[0].note
    assert book.queue[1].note == "waiting: 3 of 3 allowed nodes out of service"


def test_without_limits_the_book_decides_as_before():
    book = BudgetBook(budget=Budget(count=2))
    ask(book, "node-01", "node-04", "node-07")
    assert grant(book, placed()) == ["node-01", "node-04"]
    assert book.leases["h/node-01|node-01"].domain is None and book.leases["h/node-01|node-01"].gangs == []


def test_an_operator_sets_and_clears_each_limit_on_its_own():
    change = {"budget": {"count": 2}, "by": "ops", "reason": "r"}
    limits = BudgetChange.model_validate({**change, "nvlink_domains": 2}).limits(UnitLimits(gangs=3))
    assert limits == UnitLimits(nvlink_domains=2, gangs=3)
    assert BudgetChange.model_validate({**change, "gangs": "none"}).limits(limits) == UnitLimits(nvlink_domains=2)
    assert BudgetChange.model_validate(change).limits(limits) == limits
    keys = {"clique": "example.com/nvlink-domain", "rack": "example.com/rack", "block": "example.com/block"}
    assert BudgetChange.model_validate({**change, "topology": keys}).limits(limits).topology.clique == keys["clique"]


def test_the_label_keys_are_the_operators():
    keys = TopologyLabels(clique="example.com/nvlink-domain")
    book = BudgetBook(budget=Budget(count=10), limits=UnitLimits(nvlink_domains=1, topology=keys))
    ask(book, "node-01", "node-10")
    grant(book, placed())
    assert book.queue[0].note.endswith("(node-10 has no example.com/nvlink-domain label: its own NVLink domain)")


@given(
    domains=st.integers(1, 3),
    gangs=st.integers(1, 3),
    down=st.sets(st.sampled_from(NODES), max_size=2),
    asked=st.lists(st.sampled_from(NODES), min_size=1, max_size=10, unique=True),
)
def test_never_more_domains_or_gangs_out_than_allowed_unless_already_out(domains, gangs, down, asked):
    book = BudgetBook(budget=Budget(count=10), limits=UnitLimits(nvlink_domains=domains, gangs=gangs))
    avail = placed({n: "cordoned" for n in down}, {g: "pods on a node out" for n in down for g in GANGS.get(n, [])})
    before = UnitsOut(avail, [])
    ask(book, *asked)
    grant(book, avail)
    after = UnitsOut(avail, list(book.leases.values()))
    assert len(after.domains) <= max(domains, len(before.domains))
    assert len(after.gangs) <= max(gangs, len(before.gangs))


def test_a_gang_is_disrupted_by_a_node_out_or_below_its_minimum_but_not_while_unscheduled():
    gangs = [
        Gang(id="kai:ml/on-out", nodes=["node-01", "node-02"], pods=2, running=2, min_member=2),
        Gang(id="kai:ml/short", nodes=["node-03"], pods=4, running=1, min_member=4),
        Gang(id="kai:ml/unscheduled", pods=4, running=0, min_member=4),
        Gang(id="kai:ml/whole", nodes=["node-04"], pods=1, running=1, min_member=1),
    ]
    assert gang_disruptions(gangs, {"node-02", "node-09"}) == {
        "kai:ml/on-out": "pods on node-02, out of service",
        "kai:ml/short": "below its minimum: 1 of 4 pods running",
    }
