"""Batches that follow topology and jobs (`batchBy`, workflows/rollout/unit_batching.py): units, groups, the fill,
the refusal; the plan that shows them. Pure rules; the rollout on the emulator is in test_unit_batch_rollout.py."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from activities.kube.topology import CLIQUE_LABEL, Gang, NodePlace, place_of
from tests.workflows.rollout.helpers import rollout_spec
from workflows.partitioning.models import GpuPartitioningInput
from workflows.rollout.batching import NodeSnapshot, plan
from workflows.rollout.unit_batching import (
    groups_of,
    oversized_unit,
    own_domain_note,
    unit_batch,
    units_of,
)


def fleet(domains: int, per_domain: int, *, interleave: bool = False) -> list[NodeSnapshot]:
    """`domains` NVLink domains of `per_domain` nodes `n-0001..`; interleaved: node names do not follow domains."""
    nodes = []
    for i in range(domains * per_domain):
        domain = i % domains if interleave else i // per_domain
        labels = {"gpu": "true", CLIQUE_LABEL: f"uuid-{domain:03d}.1"}
        nodes.append(NodeSnapshot(name=f"n-{i + 1:04d}", labels=labels))
    return nodes


def places(nodes: list[NodeSnapshot]) -> dict[str, NodePlace]:
    return {n.name: place_of(n.name, n.labels) for n in nodes}


def gang(name: str, nodes: list[str], *, running: int | None = None) -> Gang:
    pods = len(nodes)
    return Gang(id=f"kai:train/{name}", nodes=sorted(nodes), pods=pods, running=pods if running is None else running,
                min_member=pods, gpus=8 * pods)  # fmt: skip


def spec(budget: int, initial_batch: int, batch_by: str = "nvlinkDomain", **fields):
    policy = {"default": {"budget": {"count": budget}, "strategy": {"fixed": {"initialBatch": initial_batch}}}}
    return rollout_spec("units", policy=policy, batchBy=batch_by, **fields)


def domain_of(node: NodeSnapshot) -> str:
    return node.labels[CLIQUE_LABEL].split(".")[0]


def assert_whole_units(batches: list[list[str]], nodes: list[NodeSnapshot]) -> None:
    domains = {n.name: domain_of(n) for n in nodes}
    members: dict[str, set[str]] = {}
    for name, d in domains.items():
        members.setdefault(d, set()).add(name)
    for i, batch in enumerate(batches):
        for d in {domains[n] for n in batch}:
            assert members[d] <= set(batch), f"batch {i} took part of domain {d}"


# ---------------------------------------------------------------- the fill


def test_a_room_of_115_takes_six_whole_domains_of_18_and_as_many_batches_as_node_count_batching():
    nodes = fleet(64, 18)
    p = plan(nodes, spec(budget=115, initial_batch=115))
    batches = [b.nodes for b in p.compartments[0].batches]
    assert [len(b) for b in batches] == [108] * 10 + [72]
    assert all(len(b.units) == 6 for b in p.compartments[0].batches[:10])
    assert len(batches) == math.ceil(len(nodes) / 115)  # node-count batching's count
    assert_whole_units(batches, nodes)
    assert p.compartments[0].batches[0].units == {
        f"uuid-{d:03d}": [f"n-{d * 18 + i + 1:04d}" for i in range(18)] for d in range(6)
    }


@pytest.mark.parametrize("seed", range(10))
def test_gangs_over_one_to_four_domains_are_interrupted_once_in_at_most_110_percent_of_the_batches(seed):
    rng = random.Random(seed)
    nodes = fleet(64, 18)
    by_domain: dict[str, list[str]] = {}
    for n in nodes:
        by_domain.setdefault(domain_of(n), []).append(n.name)
    domains = list(by_domain)
    rng.shuffle(domains)
    gangs, i = [], 0
    while i < len(domains):  # every domain busy: gangs over 1 to 4 random domains, on some of their nodes
        span = rng.randint(1, 4)
        gangs.append(gang(f"g{i}", [n for d in domains[i : i + span] for n in by_domain[d][: rng.randint(1, 18)]]))
        i += span
    batches = plan(nodes, spec(budget=115, initial_batch=115), gangs).compartments[0].batches
    assert len(batches) <= 1.10 * math.ceil(len(nodes) / 115)
    for g in gangs:
        assert len([b for b in batches if set(g.nodes) & set(b.nodes)]) == 1, g.id
    assert_whole_units([b.nodes for b in batches], nodes)


def test_a_small_strategy_size_rounds_up_to_one_whole_domain():
    nodes = fleet(4, 3, interleave=True)
    p = plan(nodes, spec(budget=6, initial_batch=1))
    batches = [b.nodes for b in p.compartments[0].batches]
    assert [len(b) for b in batches] == [3, 3, 3, 3]
    assert batches[0] == ["n-0001", "n-0005", "n-0009"]  # domain 0, though n-0002 comes second by name
    assert_whole_units(batches, nodes)


def test_gangs_spanning_domains_and_small_gangs_sharing_one_stay_in_one_batch_each():
    nodes = fleet(10, 4)
    by_domain = [[n.name for n in nodes if domain_of(n) == f"uuid-{d:03d}"] for d in range(10)]
    gangs = [
        gang("two", by_domain[0][:2] + by_domain[5][:2]),  # domains 0 and 5
        gang("four", [by_domain[d][0] for d in (1, 2, 3, 4)]),  # domains 1 to 4
        gang("left", by_domain[6][:2]),  # two small gangs in domain 6
        gang("right", by_domain[6][2:]),
        gang("three", [by_domain[d][1] for d in (7, 8, 9)]),
    ]
    p = plan(nodes, spec(budget=16, initial_batch=16), gangs)
    batches = p.compartments[0].batches
    assert_whole_units([b.nodes for b in batches], nodes)
    for g in gangs:
        holding = [i for i, b in enumerate(batches) if set(g.nodes) & set(b.nodes)]
        assert len(holding) == 1, f"{g.id} is in batches {holding}"
        assert g.id in batches[holding[0]].gangs
    assert sorted(g for b in batches for g in b.gangs) == sorted(g.id for g in gangs)  # each interrupted once
    # Groups of 8 (domains 0+5), 16 (1-4), 4 (6) and 12 (7-9) nodes in a room of 16: the best fill first, ties to
    # the order: 0+5 reaches no 16, so 1-4 alone; then 6 with 7-9; then 0+5.
    assert [sorted(b.units) for b in batches] == [
        ["uuid-001", "uuid-002", "uuid-003", "uuid-004"],
        ["uuid-006", "uuid-007", "uuid-008", "uuid-009"],
        ["uuid-000", "uuid-005"],
    ]


def test_units_that_interrupt_nothing_go_first_then_the_policy_order():
    nodes = fleet(3, 2)
    order = [n.name for n in nodes]
    busy = [gang("busy", ["n-0001"]), gang("down", ["n-0003"], running=0)]  # domain 1's gang is already disrupted
    first = unit_batch(order, places(nodes), "nvlinkDomain", busy, set(), size=2, budget_ceiling=2)
    assert list(first.units) == ["uuid-001"] and first.gangs == []
    assert unit_batch(order, places(nodes), "nvlinkDomain", busy[:1], set(), 4, 4).units.keys() == {
        "uuid-001", "uuid-002"}  # fmt: skip


def test_a_group_larger_than_the_room_is_taken_by_whole_units_never_part_of_one():
    nodes = fleet(3, 4)
    order = [n.name for n in nodes]
    wide = [gang("wide", ["n-0001", "n-0005", "n-0009"])]  # all three domains: one group of 12
    taken = unit_batch(order, places(nodes), "nvlinkDomain", wide, set(), size=6, budget_ceiling=6)
    assert list(taken.units) == ["uuid-000"] and taken.nodes == order[:4] and taken.gangs == [wide[0].id]
    # A room smaller than any unit (a ceiling of 4, one member elsewhere out of service) takes nothing: the batch
    # waits rather than split a domain.
    assert unit_batch(order, places(nodes), "nvlinkDomain", [], {"elsewhere"}, 3, 4).nodes == []


def test_nodes_already_out_of_service_cost_nothing():
    nodes = fleet(3, 2)
    order = [n.name for n in nodes]
    # Ceiling 2 with n-0003 cordoned: room 1; domain 0 costs 2, domain 1 only its other node.
    taken = unit_batch(order, places(nodes), "nvlinkDomain", [], {"n-0003"}, size=2, budget_ceiling=2)
    assert taken.units == {"uuid-001": ["n-0003", "n-0004"]}


def test_random_fleets_never_take_part_of_a_domain_nor_a_gang_twice():
    rng = random.Random(39)
    for _ in range(40):
        domains, per = rng.randint(2, 12), rng.randint(1, 6)
        nodes = fleet(domains, per, interleave=rng.random() < 0.5)
        names = [n.name for n in nodes]
        gangs = [gang(f"g{i}", rng.sample(names, rng.randint(1, min(3 * per, len(names))))) for i in range(4)]
        budget = rng.randint(per, domains * per)
        p = plan(nodes, spec(budget=budget, initial_batch=rng.randint(1, budget)), gangs)
        batches = [b.nodes for b in p.compartments[0].batches]
        assert sorted(n for b in batches for n in b) == sorted(names) and all(batches)
        assert_whole_units(batches, nodes)
        assert all(len(b) <= budget for b in batches)


# ---------------------------------------------------------------- units, the refusal, the spec


def test_a_node_without_the_clique_label_is_its_own_domain_and_the_plan_says_so():
    nodes = [*fleet(1, 2), NodeSnapshot(name="lone", labels={"gpu": "true"})]
    assert units_of([n.name for n in nodes], places(nodes), "nvlinkDomain") == {
        "uuid-000": ["n-0001", "n-0002"], "node:lone": ["lone"]}  # fmt: skip
    assert own_domain_note(list(places(nodes).values())) == (
        f"1 nodes have no {CLIQUE_LABEL} label, each its own NVLink domain: lone"
    )
    p = plan(nodes, spec(budget=2, initial_batch=2))
    assert [list(b.units) for b in p.compartments[0].batches] == [["uuid-000"], ["node:lone"]]
    assert p.warnings == [f"1 nodes have no {CLIQUE_LABEL} label, each its own NVLink domain: lone"]


def test_racks_and_the_topology_label_keys_are_the_specs():
    nodes = [NodeSnapshot(name=f"r-{i}", labels={"gpu": "true", "example.com/rack": f"rack-{i % 2}"}) for i in range(4)]
    s = spec(budget=2, initial_batch=2, batch_by="rack", topology={"rack": "example.com/rack"})
    assert [b.units for b in plan(nodes, s).compartments[0].batches] == [
        {"rack-0": ["r-0", "r-2"]}, {"rack-1": ["r-1", "r-3"]}]  # fmt: skip
    assert plan(nodes, s).warnings == []  # the clique note is about NVLink domains


def test_a_unit_over_the_ceiling_is_refused_naming_it_its_size_and_the_ceiling():
    nodes = fleet(2, 4)
    p = plan(nodes, spec(budget=3, initial_batch=1))
    refusal = oversized_unit("__default__", [n.name for n in nodes], places(nodes), "nvlinkDomain", 3)
    assert p.compartments[0].batches == [] and p.compartments[0].blocked == refusal
    assert oversized_unit("__default__", [n.name for n in nodes], places(nodes), "nvlinkDomain", 4) is None
    assert refusal == (
        "compartment '__default__': NVLink domain uuid-000 has 4 nodes, more than the compartment's ceiling of 3; "
        "batchBy nvlinkDomain takes every NVLink domain whole: raise the compartment's budget to at least 4 "
        "nodes, or set batchBy: none"
    )


def test_without_batch_by_the_plan_is_node_count_batching():
    p = plan(fleet(4, 3, interleave=True), spec(budget=5, initial_batch=5, batch_by="none"))
    assert [len(b.nodes) for b in p.compartments[0].batches] == [5, 5, 2]
    assert all(b.units == {} and b.gangs == [] for b in p.compartments[0].batches)


def test_groups_join_units_only_through_gangs_still_whole():
    units = {"a": ["1"], "b": ["2"], "c": ["3"]}
    groups, busy = groups_of(units, [gang("ab", ["1", "2"]), gang("bc", ["2", "3"], running=0)])
    assert groups == [["a", "b"], ["c"]] and busy == {"a", "b"}


@pytest.mark.parametrize(
    "fields, path",
    [
        ({"batchBy": "zone"}, "batchBy"),
        ({"topology": {"switch": "x"}}, "topology.switch"),
        ({"topology": {"clique": ""}}, "topology.clique"),
    ],
)
def test_batch_by_and_topology_are_validated_with_their_paths(fields, path):
    with pytest.raises(ValidationError) as err:
        rollout_spec("bad", **fields)
    assert path in str(err.value)
    partitioning = {"cluster": "lab", "name": "mig", "config": "all-disabled", "nodes": ["n-1"], **fields}
    with pytest.raises(ValidationError) as err:
        GpuPartitioningInput.model_validate(partitioning)
    assert path in str(err.value)


def test_fleet_inputs_take_batch_by_and_topology_in_camel_case():
    s = rollout_spec("ok", batchBy="rack", topology={"rack": "oci.oraclecloud.com/host.rack_id"})
    assert s.batch_by == "rack" and s.topology.rack == "oci.oraclecloud.com/host.rack_id"
    assert rollout_spec("default").batch_by == "none"
    mig = GpuPartitioningInput.model_validate(
        {"cluster": "lab", "name": "mig", "config": "all-disabled", "nodes": ["n-1"], "batchBy": "nvlinkDomain"}
    )
    assert mig.batch_by == "nvlinkDomain" and mig.model_dump(by_alias=True)["batchBy"] == "nvlinkDomain"
