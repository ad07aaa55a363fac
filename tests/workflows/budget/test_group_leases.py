"""Group leases (`Lease.group`, workflows/budget/book.py `grant`; workflows/budget/leases.py `acquire_leases`): a
group is granted whole in one decision or waits whole, saying why; it takes its place first come, first served; the
NVLink-domain limit counts a rack whose nodes lost their clique label as one domain; the circuit breaker takes or
refuses the whole group at once. Without a server, then a workflow leasing a group from the real entity."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError

from activities.kube.models import NodeAvailability
from tests.kube_helpers import wait_for
from tests.workflows.budget.group_probe import GroupProbe, GroupProbeInput
from tests.workflows.budget.test_disruption_budget import small_fleet, start_budget, state_where
from tests.workflows.budget.test_lease_book import NODES, T0, cluster
from tests.workflows.budget.test_unit_limits import RACK_A, UUID_B, racks
from worker import registry
from worker.config import WorkerSettings
from workflows.budget.book import BudgetBook
from workflows.budget.breaker import BreakerSettings
from workflows.budget.budget import Budget
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import LeaseRequest, LeaseRequests
from workflows.budget.models import BudgetChange
from workflows.budget.units import UnitLimits

BREAKER = BreakerSettings(max_percent=20, window=timedelta(minutes=5))  # 2 of the 10 nodes


def ask(
    book: BudgetBook, *nodes: str, group: str | None = None, requester: str = "rack", holder: str = "",
    remediation: BreakerSettings | None = None, budget: Budget | None = None,
) -> None:  # fmt: skip
    """One request_leases signal: `nodes` as `group` (None: single requests), each held by `holder` (default: per
    node)."""
    requests = [LeaseRequest(node=n, holder=holder or f"h/{n}", request_id=f"r/{n}", group=group,
                             remediation=remediation) for n in nodes]  # fmt: skip
    book.take_requests(LeaseRequests(reply_to=requester, task_queue="q", budget=budget, requests=requests), "lab", T0)


def decide(book: BudgetBook, avail: NodeAvailability | None = None) -> tuple[list[str], list[str]]:
    granted, refused = book.grant(avail or cluster(), T0, breaker=True, control_plane=True)
    return [g.node for g in granted], [r.node for r in refused]


def notes(book: BudgetBook) -> dict[str, str]:
    return {q.node: q.note for q in book.queue}


def test_a_group_that_fits_is_granted_whole_in_one_decision():
    book = BudgetBook(budget=Budget(count=4))
    ask(book, "node-01", "node-02", "node-03", group="rack-a", holder="rack/a")
    assert decide(book, cluster({"node-02": "cordoned"})) == (["node-01", "node-02", "node-03"], [])
    leases = book.leases.values()
    assert {lease.group for lease in leases} == {"rack-a"} and {lease.granted_at for lease in leases} == {T0}
    assert book.leases["rack/a|node-02"].note == "the node was already out of service"


def test_a_group_that_does_not_fit_waits_whole_and_holds_up_later_requests_that_cost_a_node():
    book = BudgetBook(budget=Budget(count=3))
    ask(book, "node-01", "node-02", "node-03", group="rack-a")
    ask(book, "node-04", "node-09", requester="maintenance")
    # node-09 is out already: 1 of 3; the group needs 3 more. node-04 would fit alone but comes after the group;
    # node-09 costs nothing and passes.
    assert decide(book, cluster({"node-09": "NotReady"})) == (["node-09"], [])
    waiting = "waiting: the 3 nodes of group rack-a need 3 more out of service; 1 of 3 allowed"
    assert notes(book) == {"node-01": waiting, "node-02": waiting, "node-03": waiting,
                           "node-04": "waiting: 1 of 3 allowed nodes out of service"}  # fmt: skip
    assert [q.position for q in book.queue] == [1, 2, 3, 4]
    # node-09 back in service, its lease released: the group fits, and node-04 waits behind it.
    book.drop("h/node-09|node-09", "released")
    assert decide(book) == (["node-01", "node-02", "node-03"], [])
    assert notes(book) == {"node-04": "waiting: 3 of 3 allowed nodes out of service"}


def test_a_group_larger_than_the_budget_says_so():
    book = BudgetBook(budget=Budget(count=2))
    ask(book, "node-01", "node-02", "node-03", group="rack-a")
    decide(book)
    assert book.queue[0].note == ("waiting: the 3 nodes of group rack-a need 3 more out of service; 0 of 2 allowed "
                                  "(more than the budget allows at all, until an operator raises it)")  # fmt: skip


def test_a_group_is_one_requesters_and_decided_at_its_first_members_place():
    book = BudgetBook(budget=Budget(count=3))
    ask(book, "node-01", group="rack-a", requester="one")
    ask(book, "node-05", requester="other")
    ask(book, "node-02", "node-03", group="rack-a", requester="one")  # joins its group, behind node-05
    ask(book, "node-04", group="rack-a", requester="two")  # another requester's group of that name
    assert decide(book) == (["node-01", "node-02", "node-03"], [])
    assert notes(book) == {"node-05": "waiting: 3 of 3 allowed nodes out of service",
                           "node-04": "waiting: the 1 nodes of group rack-a need 1 more out of service; "
                                      "3 of 3 allowed"}  # fmt: skip


def test_a_group_held_by_its_requesters_own_budget_or_the_control_plane_holds_nobody_up():
    book = BudgetBook(budget=Budget(count=5))
    ask(book, "node-01", "node-02", "node-03", group="rack-a", budget=Budget(count=2))
    ask(book, "node-04", requester="maintenance")
    assert decide(book) == (["node-04"], [])
    assert book.queue[0].note == ("waiting: the 3 nodes of group rack-a need 3 of its requester rack's own budget, "
                                  "which allows 2; it holds 0")  # fmt: skip
    plane = BudgetBook(budget=Budget(count=5))
    ask(plane, "node-01", "node-02", group="control")
    ask(plane, "node-05", requester="maintenance")
    assert decide(plane, cluster(control_plane=("node-01", "node-02", "node-03"))) == (["node-05"], [])
    assert plane.queue[0].note.startswith("waiting: the 2 nodes of group control: control-plane node node-02 waits "
                                          "while 1 control-plane node (node-01) is out of service")  # fmt: skip


def test_a_rack_whose_nodes_lost_their_clique_label_is_one_nvlink_domain_for_a_group():
    # A fabric fault took the label off every node of rack-a; rack-b's node-04 shows domain B.
    faulted = racks({"node-04": UUID_B}, {**dict.fromkeys(RACK_A, "rack-a"), "node-04": "rack-b"})
    book = BudgetBook(budget=Budget(count=10), limits=UnitLimits(nvlink_domains=1))
    ask(book, *RACK_A, group="rack-a")
    ask(book, "node-04", requester="maintenance")
    assert decide(book, faulted) == (RACK_A, [])
    assert {book.leases[f"h/{n}|{n}"].domain for n in RACK_A} == {"rack:rack-a"}
    assert book.queue[0].note.startswith("waiting: 1 of 1 allowed NVLink domains have nodes out of service (node-04")
    # Without a rack label each node would be a domain of its own: the group waits for the limit.
    unracked = BudgetBook(budget=Budget(count=10), limits=UnitLimits(nvlink_domains=1))
    ask(unracked, *RACK_A, group="rack-a")
    assert decide(unracked, racks({}, {})) == ([], [])
    assert unracked.queue[0].note == (
        "waiting: the 3 nodes of group rack-a: 1 of 1 allowed NVLink domains have nodes out of service (node-02 has "
        "no nvidia.com/gpu.clique label: its own NVLink domain)"
    )


def test_the_breaker_takes_a_remediation_group_whole_or_refuses_it_whole():
    book = BudgetBook(budget=Budget(count=10))
    ask(book, "node-01", "node-02", group="rack-a", remediation=BREAKER)
    assert decide(book) == (["node-01", "node-02"], [])
    assert [t.node for t in book.breaker.taken] == ["node-01", "node-02"]
    # Three more would be 5 of 10 within the window: every member refused, none recorded, the refusal counted once.
    ask(book, "node-03", "node-04", "node-05", group="rack-b", remediation=BREAKER, requester="rack-b")
    ask(book, "node-06", requester="rollout")
    granted, refused = book.grant(cluster(), T0, breaker=True, control_plane=True)
    assert [g.node for g in granted] == ["node-06"]
    assert [(r.node, r.state, r.note) for r in refused] == [(n, "refused", book.breaker.refusal())
                                                            for n in ("node-03", "node-04", "node-05")]  # fmt: skip
    assert [t.node for t in book.breaker.taken] == ["node-01", "node-02"]
    assert book.breaker.tripped and book.breaker.refused == 1
    assert "node-03, node-04, node-05 too would be more than 20%" in book.breaker.reason
    # Tripped: the next remediation group is refused at once, counted once, and holds nobody up.
    ask(book, "node-07", "node-08", group="rack-c", remediation=BREAKER, requester="rack-c")
    assert decide(book)[1] == ["node-07", "node-08"] and book.breaker.refused == 2


@given(
    count=st.integers(1, 6),
    down=st.sets(st.sampled_from(NODES), max_size=3),
    split=st.lists(st.integers(0, 3), min_size=10, max_size=10),
)
def test_a_group_is_never_granted_in_part(count, down, split):
    """Each node asked in one of three groups or alone (0), in node order; whatever the budget and the nodes
    out, every group ends all granted or all waiting, and the node count holds."""
    book = BudgetBook(budget=Budget(count=count))
    for node, group in zip(NODES, split, strict=True):
        ask(book, node, group=f"g{group}" if group else None)
    granted, _ = decide(book, cluster({n: "cordoned" for n in down}))
    for group in {f"g{g}" for g in split if g}:
        members = [lease.state for lease in book.everyone() if lease.group == group]
        assert len(set(members)) == 1, (group, members)
    assert len(set(down) | set(granted)) <= max(count, len(down))


def test_a_request_without_a_group_is_sent_and_kept_as_before():
    request = LeaseRequest(node="node-01", holder="h")
    assert "group" not in request.model_dump(mode="json")
    assert LeaseRequest(node="node-01", holder="h", group="rack-a").model_dump(mode="json")["group"] == "rack-a"
    book = BudgetBook(budget=Budget(count=1))
    ask(book, "node-01")
    decide(book)
    assert "group" not in book.leases["h/node-01|node-01"].model_dump(mode="json")


# ---------------------------------------------------------------- on a server


async def request_signals(entity) -> list[str]:
    """The names of the request and release signals the entity's run received, in order."""
    return [e.workflow_execution_signaled_event_attributes.signal_name
            async for e in entity.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]  # fmt: skip


async def start_probe(client, worker, nodes: list[str], group: str):
    return await client.start_workflow(GroupProbe.run, GroupProbeInput(cluster="lab", nodes=nodes, group=group),
                                       id=f"group-probe/{uuid.uuid4().hex[:6]}", task_queue=worker.task_queue)  # fmt: skip


@pytest.mark.timeout(60)
async def test_a_workflow_leases_a_group_once_it_fits_and_returns_it(client, kubeconfig_path, k8s):
    await k8s.seed(small_fleet())
    built = registry.build(WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0))
    registration = registry.Registration(workflows=[*built.workflows, GroupProbe], activities=built.activities,
                                         resources=built.resources)  # fmt: skip
    try:
        async with registry.new_worker(client, registration, f"test-{uuid.uuid4().hex[:8]}") as worker:
            entity = await start_budget(client, worker, {"count": 2})
            probe = await start_probe(client, worker, RACK_A, "rack-a")
            waiting = ("waiting: the 3 nodes of group rack-a need 3 more out of service; 0 of 2 allowed (more than "
                       "the budget allows at all, until an operator raises it)")  # fmt: skip
            await wait_for(lambda: probe.query(GroupProbe.notes), what="the group waiting")
            assert await probe.query(GroupProbe.notes) == [waiting]
            state = await state_where(entity, lambda s: len(s.queue) == 3, "the group queued")
            assert state.leases == [] and {q.note for q in state.queue} == {waiting}
            with pytest.raises(WorkflowUpdateFailedError) as by_update:  # a group comes in one signal
                await entity.execute_update(DisruptionBudget.acquire,
                                            LeaseRequest(node="node-04", holder="h", group="rack-b"))  # fmt: skip
            assert "never by update" in str(by_update.value.cause)

            # Another group waits behind it, first come first served, and is withdrawn whole when cancelled.
            other = await start_probe(client, worker, ["node-04", "node-05"], "rack-b")
            await state_where(entity, lambda s: len(s.queue) == 5, "the second group queued")
            await other.signal(GroupProbe.cancel)
            assert (await asyncio.wait_for(other.result(), 30)).leases == []
            await state_where(entity, lambda s: [q.group for q in s.queue] == ["rack-a"] * 3, "the second withdrawn")

            await entity.execute_update(DisruptionBudget.set_budget,
                                        BudgetChange(budget=Budget(count=3), by="test", reason="room for the rack"))  # fmt: skip
            state = await state_where(entity, lambda s: len(s.leases) == 3, "the group granted")
            assert len({lease.granted_at for lease in state.leases}) == 1  # one decision

            await probe.signal(GroupProbe.done)
            result = await asyncio.wait_for(probe.result(), 30)
            assert [(lease.node, lease.state, lease.group) for lease in result.leases] == [
                (n, "granted", "rack-a") for n in RACK_A
            ]
            await state_where(entity, lambda s: not s.leases and not s.queue, "the group returned")
            # One signal per group each way.
            assert await request_signals(entity) == ["request_leases", "request_leases", "release_leases",
                                                     "release_leases"]  # fmt: skip
            await entity.terminate("test over")
    finally:
        await registration.close()
