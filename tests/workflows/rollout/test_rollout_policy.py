"""NodeWright's batch arithmetic, ported: worked examples from the reference, every rule,
and property tests (hypothesis) for the invariants Millwright relies on.

Longer than 600 lines because it is the one test module of workflows/rollout/batching.py, read side by side with it
and with NodeWright's worked examples."""

from __future__ import annotations

import functools
import operator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workflows.budget.budget import Budget, ceiling
from workflows.rollout.batching import (
    NodeSnapshot,
    admissible,
    admit,
    assign_compartments,
    choose_compartment,
    coalesce_interrupts,
    config_change_interrupt,
    evaluate_batch,
    next_batch_size,
    next_window_open,
    package_order,
    package_waves,
    plan,
    progress_percent,
    should_stop,
    strategy_rank,
    success_percent,
    window_open,
)
from workflows.rollout.spec.admission import MaintenanceWindow
from workflows.rollout.spec.deployment_policy import (
    DEFAULT_COMPARTMENT,
    Compartment,
    DeploymentPolicy,
    ExponentialStrategy,
    FixedStrategy,
    LinearStrategy,
    PolicyDefault,
    Strategy,
)
from workflows.rollout.spec.label_selector import LabelSelector
from workflows.rollout.spec.packages import Interrupt, Package
from workflows.rollout.spec.spec import RolloutInput
from workflows.rollout.state import BatchState

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fixed(**kw) -> Strategy:
    return Strategy(fixed=FixedStrategy(**kw))


def linear(**kw) -> Strategy:
    return Strategy(linear=LinearStrategy(**kw))


def exponential(**kw) -> Strategy:
    return Strategy(exponential=ExponentialStrategy(**kw))


def run_all_succeed(strategy: Strategy | None, total: int, cap: int | None = None, unavailable: int = 0) -> list[int]:
    """The batch sizes of a compartment where every node succeeds."""
    state, sizes = BatchState(), []
    cap = total if cap is None else cap
    while state.completed_nodes < total:
        size = admissible(next_batch_size(strategy, state, total, cap), cap, unavailable)
        if size == 0:
            break
        sizes.append(size)
        state = evaluate_batch(strategy, state, succeeded=size, failed=0, total=total)
    return sizes


# ---------------------------------------------------------------- ceiling


@pytest.mark.parametrize(
    "budget, matched, expected",
    [
        (Budget(count=3), 10, 3),
        (Budget(count=3), 0, 3),  # count is a count, whatever matched
        (Budget(percent=50), 10, 5),
        (Budget(percent=50), 5, 2),  # floor
        (Budget(percent=10), 5, 1),  # minimum 1
        (Budget(percent=100), 7, 7),
        (Budget(percent=50), 0, 0),  # a percent of nothing
        (Budget(percent=29), 100, 29),  # exact integers: NodeWright's float64 arithmetic gives 28
        (Budget(percent=57), 100, 57),  # NodeWright: 56
    ],
)
def test_ceiling(budget, matched, expected):
    assert ceiling(budget, matched) == expected


# ---------------------------------------------------------------- compartment assignment


def comp(name, labels, budget=None, strategy=None) -> Compartment:
    return Compartment(
        name=name, selector=LabelSelector(match_labels=labels), budget=budget or Budget(count=1), strategy=strategy
    )


def pol(*compartments) -> DeploymentPolicy:
    return DeploymentPolicy(compartments=list(compartments))


def test_strategy_rank_fixed_linear_exponential_then_none():
    assert strategy_rank(fixed()) < strategy_rank(linear()) < strategy_rank(exponential()) < strategy_rank(None)


def test_tie_break_strategy_first():
    p = pol(
        comp("a-exp", {"gpu": "h100"}, strategy=exponential()),
        comp("b-lin", {"zone": "z1"}, strategy=linear()),
        comp("c-fixed", {"rack": "r1"}, budget=Budget(count=50), strategy=fixed()),
    )
    labels = {"gpu": "h100", "zone": "z1", "rack": "r1"}
    assert choose_compartment(labels, p, {}) == "c-fixed"
    assert choose_compartment({"gpu": "h100", "zone": "z1"}, p, {}) == "b-lin"
    # No strategy ranks after exponential (NodeWright's StrategyTypeUnknown, 999).
    p2 = pol(comp("none", {"gpu": "h100"}), comp("exp", {"zone": "z1"}, strategy=exponential()))
    assert choose_compartment({"gpu": "h100", "zone": "z1"}, p2, {}) == "exp"


def test_tie_break_smaller_ceiling_then_name():
    p = pol(
        comp("big", {"gpu": "h100"}, budget=Budget(percent=50), strategy=fixed()),
        comp("small", {"zone": "z1"}, budget=Budget(percent=50), strategy=fixed()),
    )
    # The ceiling is over the nodes each selector matches: 50% of 10 = 5 vs 50% of 4 = 2.
    assert choose_compartment({"gpu": "h100", "zone": "z1"}, p, {"big": 10, "small": 4}) == "small"
    assert choose_compartment({"gpu": "h100", "zone": "z1"}, p, {"big": 4, "small": 10}) == "big"
    # Same strategy, same ceiling: the name decides.
    assert choose_compartment({"gpu": "h100", "zone": "z1"}, p, {"big": 4, "small": 4}) == "big"


def test_unmatched_nodes_go_to_default():
    p = pol(comp("prod", {"env": "prod"}))
    nodes = [
        NodeSnapshot(name="n2", labels={"env": "prod"}),
        NodeSnapshot(name="n1", labels={"env": "dev"}),
        NodeSnapshot(name="n0"),
    ]
    assert assign_compartments(nodes, p) == {"prod": ["n2"], DEFAULT_COMPARTMENT: ["n0", "n1"]}


def test_assignment_counts_selector_matches_for_the_tie_break():
    # 6 nodes match "wide" (50% → 3), 2 match "narrow" (50% → 1): overlapping nodes go to "narrow".
    p = pol(
        comp("wide", {"gpu": "h100"}, budget=Budget(percent=50), strategy=linear()),
        comp("narrow", {"rack": "r1"}, budget=Budget(percent=50), strategy=linear()),
    )
    nodes = [NodeSnapshot(name=f"n{i}", labels={"gpu": "h100"} | ({"rack": "r1"} if i < 2 else {})) for i in range(6)]
    assert assign_compartments(nodes, p) == {
        "wide": ["n2", "n3", "n4", "n5"],
        "narrow": ["n0", "n1"],
        DEFAULT_COMPARTMENT: [],
    }


# ---------------------------------------------------------------- batch sizes


def test_fixed_sequence():
    assert run_all_succeed(fixed(initial_batch=3), 10) == [3, 3, 3, 1]


def test_linear_sequence():
    assert run_all_succeed(linear(), 10) == [1, 2, 3, 4]
    assert run_all_succeed(linear(initial_batch=1, delta=2), 20) == [1, 3, 5, 7, 4]


def test_exponential_sequence():
    assert run_all_succeed(exponential(), 20) == [1, 2, 4, 8, 5]
    assert run_all_succeed(exponential(initial_batch=2, growth_factor=3), 30) == [2, 6, 18, 4]


def test_no_strategy_uses_the_ceiling():
    assert next_batch_size(None, BatchState(), 10, 4) == 4
    assert run_all_succeed(None, 10, cap=4) == [4, 4, 2]


def test_linear_shrinks_after_a_failed_batch_below_the_safety_limit():
    s = linear(delta=2, safety_limit=50)
    state = BatchState(last_batch_size=5, last_batch_failed=True, completed_nodes=2, failed_nodes=1)
    assert next_batch_size(s, state, 20, 20) == 3  # progress 15% < 50%: 5 - 2
    assert next_batch_size(s, state.model_copy(update={"last_batch_size": 2}), 20, 20) == 1  # max(1, 0)
    past = state.model_copy(update={"completed_nodes": 10})  # progress 55% ≥ 50%: keeps growing
    assert next_batch_size(s, past, 20, 20) == 7


def test_exponential_shrinks_after_a_failed_batch_below_the_safety_limit():
    s = exponential(growth_factor=2, safety_limit=50)
    state = BatchState(last_batch_size=8, last_batch_failed=True, completed_nodes=6, failed_nodes=1)
    assert next_batch_size(s, state, 100, 100) == 4
    assert next_batch_size(s, state.model_copy(update={"last_batch_size": 1}), 100, 100) == 1
    assert next_batch_size(s, state.model_copy(update={"completed_nodes": 60}), 100, 100) == 16


def test_safe_default_safety_limit_always_shrinks():
    state = BatchState(last_batch_size=8, last_batch_failed=True, completed_nodes=90, failed_nodes=1)
    assert next_batch_size(exponential(), state, 100, 100) == 4  # progress 91% < 100%


def test_fixed_ignores_failures():
    state = BatchState(last_batch_size=3, last_batch_failed=True, failed_nodes=3)
    assert next_batch_size(fixed(initial_batch=3), state, 10, 10) == 3


def test_clamped_to_remaining():
    state = BatchState(last_batch_size=4, completed_nodes=9)
    assert next_batch_size(exponential(), state, 10, 10) == 1
    assert next_batch_size(fixed(initial_batch=5), BatchState(completed_nodes=8), 10, 10) == 2
    assert next_batch_size(fixed(), BatchState(completed_nodes=10), 10, 10) == 0  # nothing left
    assert next_batch_size(linear(), BatchState(), 0, 0) == 0


# ---------------------------------------------------------------- Millwright's hard cap


@pytest.mark.parametrize(
    "batch, cap, unavailable, expected",
    [(8, 5, 0, 5), (8, 5, 2, 3), (2, 5, 2, 2), (8, 5, 5, 0), (8, 5, 7, 0), (0, 5, 0, 0)],
)
def test_admissible(batch, cap, unavailable, expected):
    assert admissible(batch, cap, unavailable) == expected


@pytest.mark.parametrize(
    "order, unavailable, batch, cap, expected",
    [
        # Issue 43: one node, ceiling 1, left cordoned by its own failure: its retry costs nothing more.
        (["a"], {"a"}, 1, 1, ["a"]),
        # No room: the waiting nodes wait, the retry out of service goes.
        (["b", "c", "a"], {"a"}, 1, 1, ["a"]),
        # Room for one new node: taken in order; the retry takes no room.
        (["b", "c", "a"], {"a"}, 3, 2, ["b", "a"]),
        (["b", "c", "a"], {"a"}, 1, 2, ["b"]),
        # Out of service though not due (not in the order): fills the ceiling, nothing new goes.
        (["b"], {"x"}, 1, 1, []),
        (["b", "c"], set(), 5, 1, ["b"]),
    ],
)
def test_a_node_already_out_of_service_costs_nothing_more(order, unavailable, batch, cap, expected):
    assert admit(order, unavailable, batch, cap) == expected


def test_budget_caps_an_exponential_strategy():
    # NodeWright: 1, 2, 4, 8, 16, 32, 37 on 100 nodes whatever the budget. Millwright: never above 10.
    assert run_all_succeed(exponential(), 100, cap=10) == [1, 2, 4, 8] + [10] * 8 + [5]
    # Two nodes already cordoned by someone else leave room for 8.
    assert max(run_all_succeed(exponential(), 100, cap=10, unavailable=2)) == 8


# ---------------------------------------------------------------- evaluation


def test_success_percent_integer_division():
    assert success_percent(4, 1) == 80
    assert success_percent(2, 1) == 66
    assert success_percent(0, 0) == 0


@pytest.mark.parametrize("threshold", [81, 90, 99, 100])
def test_five_nodes_any_threshold_above_80_behaves_as_100(threshold):
    for succeeded in range(6):
        failed = 5 - succeeded
        strict = evaluate_batch(fixed(batch_threshold=100), BatchState(), succeeded, failed, 5)
        loose = evaluate_batch(fixed(batch_threshold=threshold), BatchState(), succeeded, failed, 5)
        assert strict.last_batch_failed == loose.last_batch_failed == (succeeded < 5)


def test_five_nodes_threshold_80_tolerates_one_failure():
    assert not evaluate_batch(fixed(batch_threshold=80), BatchState(), 4, 1, 5).last_batch_failed
    assert evaluate_batch(fixed(batch_threshold=81), BatchState(), 4, 1, 5).last_batch_failed


def test_blocked_nodes_are_excluded_and_an_all_blocked_batch_is_not_evaluated():
    s = fixed(batch_threshold=100, failure_threshold=1)
    state = BatchState(current_batch=3, completed_nodes=4)
    # 3 nodes in the batch, 1 blocked: 2 of 2 with an outcome succeeded → 100%.
    after = evaluate_batch(s, state, succeeded=2, failed=0, total=10)
    assert not after.last_batch_failed and after.completed_nodes == 6 and after.last_batch_size == 2
    assert evaluate_batch(s, state, 0, 0, 10) == state


def test_counters_and_consecutive_failures():
    s = fixed(initial_batch=2, batch_threshold=100)
    state = BatchState()
    state = evaluate_batch(s, state, 1, 1, 10)
    assert (state.current_batch, state.consecutive_failures, state.completed_nodes, state.failed_nodes) == (2, 1, 1, 1)
    state = evaluate_batch(s, state, 1, 1, 10)
    assert state.consecutive_failures == 2 and state.last_batch_failed
    state = evaluate_batch(s, state, 2, 0, 10)
    assert state.consecutive_failures == 0 and not state.last_batch_failed and state.current_batch == 4
    assert progress_percent(state, 10) == 60
    assert not state.should_stop  # no failureThreshold: never stops


def test_no_strategy_only_moves_counters():
    state = evaluate_batch(None, BatchState(), 1, 2, 10)
    assert state == BatchState(current_batch=2, completed_nodes=1, failed_nodes=2, last_batch_size=3)


def test_should_stop_rule():
    assert should_stop(2, 50, 2, 49)
    assert not should_stop(2, 50, 2, 50)  # at the safety limit: never stops
    assert not should_stop(2, 50, 1, 10)
    assert not should_stop(None, 100, 99, 0)


def _ten_nodes_fourth_batch_fails(safety_limit: int) -> BatchState:
    s = fixed(initial_batch=2, failure_threshold=1, safety_limit=safety_limit)
    state = BatchState()
    for _ in range(3):  # 6 of 10 done: 60%
        state = evaluate_batch(s, state, 2, 0, 10)
    return evaluate_batch(s, state, 1, 1, 10)  # progress after: 80%


def test_failure_threshold_1_with_safety_limit_50_does_not_stop_after_halfway():
    # The documented trap: "stop on the first failed batch, but only during the first half".
    state = _ten_nodes_fourth_batch_fails(safety_limit=50)
    assert state.last_batch_failed and state.consecutive_failures == 1 and not state.should_stop


def test_failure_threshold_1_with_the_safe_default_stops():
    state = _ten_nodes_fourth_batch_fails(safety_limit=100)
    assert state.should_stop
    assert fixed(failure_threshold=1).params.safety_limit == 100


def test_failure_in_the_first_half_stops_either_way():
    for limit in (50, 100):
        s = fixed(initial_batch=2, failure_threshold=1, safety_limit=limit)
        assert evaluate_batch(s, BatchState(), 1, 1, 10).should_stop  # progress 20%


def test_should_stop_stays_set_until_reset():
    s = fixed(failure_threshold=1)
    state = evaluate_batch(s, BatchState(), 0, 1, 10)
    assert state.should_stop
    state = evaluate_batch(s, state, 1, 0, 10)
    assert state.should_stop and state.consecutive_failures == 0
    assert not BatchState().should_stop


def test_batch_state_round_trips_for_continue_as_new():
    state = BatchState(
        current_batch=4,
        consecutive_failures=1,
        completed_nodes=7,
        failed_nodes=1,
        should_stop=False,
        last_batch_size=4,
        last_batch_failed=True,
    )
    dumped = state.model_dump(mode="json")
    assert dumped["lastBatchFailed"] is True
    assert BatchState.model_validate(dumped) == state
    assert BatchState.model_validate_json(state.model_dump_json()) == state


# ---------------------------------------------------------------- packages and interrupts


def test_coalesce_interrupts():
    svc = Interrupt(type="service", services=["kubelet"])
    svc2 = Interrupt(type="service", services=["containerd", "kubelet"])
    assert coalesce_interrupts([]) is None
    assert coalesce_interrupts([None, None]) is None
    assert coalesce_interrupts([Interrupt(type="noop"), None]) == Interrupt(type="noop")
    assert coalesce_interrupts([svc, svc2, Interrupt(type="noop")]) == Interrupt(
        type="service", services=["containerd", "kubelet"]
    )
    assert coalesce_interrupts([svc, Interrupt(type="reboot"), svc2]) == Interrupt(type="reboot")
    assert coalesce_interrupts([svc, Interrupt(type="restartAllServices")]) == Interrupt(
        type="restartAllServices", services=["kubelet"]
    )


def test_coalesce_package_interrupts():
    packages = {
        "aa": Package(version="1.0.0", image="x/aa", interrupt=Interrupt(type="service", services=["a"])),
        "bb": Package(version="1.0.0", image="x/bb"),
        "cc": Package(version="1.0.0", image="x/cc", interrupt=Interrupt(type="reboot")),
    }
    assert coalesce_interrupts(packages) == Interrupt(type="reboot")
    assert coalesce_interrupts([packages["aa"], packages["bb"]]) == Interrupt(type="service", services=["a"])
    assert coalesce_interrupts([packages["bb"]]) is None


def test_config_change_interrupt_is_the_strongest_match():
    p = Package.model_validate(
        {
            "version": "1.0.0",
            "image": "x/tuned",
            "configMap": {"a.conf": "", "b.conf": "", "grub": ""},
            "configInterrupts": {"*.conf": {"type": "service", "services": ["tuned"]}, "grub": {"type": "reboot"}},
        }
    )
    assert config_change_interrupt(p, ["a.conf"]) == Interrupt(type="service", services=["tuned"])
    assert config_change_interrupt(p, ["a.conf", "grub"]) == Interrupt(type="reboot")
    assert config_change_interrupt(p, []) is None


def test_package_order_and_waves():
    packages = {
        "tuning": Package.model_validate({"version": "1.0.0", "image": "x/t", "dependsOn": {"driver": "2.0.0"}}),
        "driver": Package.model_validate({"version": "2.0.0", "image": "x/d", "dependsOn": {"base": "1.0.0"}}),
        "base": Package(version="1.0.0", image="x/b"),
        "kdump": Package(version="1.0.0", image="x/k"),
    }
    assert package_order(packages) == ["base", "kdump", "driver", "tuning"]
    assert package_waves(packages) == [["base", "kdump"], ["driver"], ["tuning"]]


# ---------------------------------------------------------------- maintenance windows


PARIS = ZoneInfo("Europe/Paris")


def test_window_open_and_wrapping_past_midnight():
    w = MaintenanceWindow(days=["fri"], start_hour=22, end_hour=4, time_zone="Europe/Paris")
    # 2026-01-09 is a Friday.
    assert not window_open([w], datetime(2026, 1, 9, 21, 59, tzinfo=PARIS))
    assert window_open([w], datetime(2026, 1, 9, 22, 0, tzinfo=PARIS))
    assert window_open([w], datetime(2026, 1, 10, 3, 59, tzinfo=PARIS))  # Saturday morning, still Friday's window
    assert not window_open([w], datetime(2026, 1, 10, 4, 0, tzinfo=PARIS))
    assert not window_open([w], datetime(2026, 1, 10, 22, 30, tzinfo=PARIS))  # Saturday evening
    # Time zones are honoured: 21:30 UTC is 22:30 in Paris in winter.
    assert window_open([w], datetime(2026, 1, 9, 21, 30, tzinfo=UTC))
    assert window_open([], datetime(2026, 1, 9, 12, 0, tzinfo=UTC))  # no windows: always
    with pytest.raises(ValueError):
        window_open([w], datetime(2026, 1, 9, 22, 0))


def test_end_hour_24_and_0_mean_midnight():
    for end in (0, 24):
        w = MaintenanceWindow(start_hour=20, end_hour=end)
        assert window_open([w], datetime(2026, 1, 9, 23, 59, tzinfo=UTC))
        assert not window_open([w], datetime(2026, 1, 10, 0, 0, tzinfo=UTC))


def test_next_window_open():
    w = MaintenanceWindow(days=["sat", "sun"], start_hour=2, end_hour=5, time_zone="Europe/Paris")
    at = datetime(2026, 1, 7, 10, 7, tzinfo=UTC)  # Wednesday
    nxt = next_window_open([w], at)
    assert nxt.astimezone(PARIS) == datetime(2026, 1, 10, 2, 0, tzinfo=PARIS)
    assert next_window_open([w], nxt) == nxt
    # Half-hour offsets: 02:00 in Kolkata is 20:30 UTC the day before.
    k = MaintenanceWindow(start_hour=2, end_hour=4, time_zone="Asia/Kolkata")
    nxt = next_window_open([k], datetime(2026, 1, 7, 0, 0, tzinfo=UTC))
    assert nxt == datetime(2026, 1, 7, 20, 30, tzinfo=UTC)


def test_next_window_open_across_a_dst_change():
    # Paris springs forward on 2026-03-29 at 02:00 → 03:00; a 02:00-04:00 window opens at 03:00.
    w = MaintenanceWindow(days=["sun"], start_hour=2, end_hour=4, time_zone="Europe/Paris")
    nxt = next_window_open([w], datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
    assert nxt == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert nxt.astimezone(PARIS).hour == 3


# ---------------------------------------------------------------- plan


def rollout(**kw) -> RolloutInput:
    data = {
        "cluster": "lab",
        "name": "drv",
        "nodeSelectors": {"matchLabels": {"gpu": "yes"}},
        "packages": {
            "driver": {"version": "1.0.0", "image": "x/driver", "interrupt": {"type": "reboot"}},
            "tuned": {
                "version": "1.0.0",
                "image": "x/tuned",
                "dependsOn": {"driver": "1.0.0"},
                "interrupt": {"type": "service", "services": ["tuned"]},
            },
        },
    }
    data.update(kw)
    return RolloutInput.model_validate(data)


def test_plan_worked_example():
    spec = rollout(
        deploymentPolicy={
            "default": {"budget": {"percent": 50}, "strategy": {"exponential": {}}},
            "compartments": [
                {
                    "name": "prod",
                    "selector": {"matchLabels": {"env": "prod"}},
                    "budget": {"count": 3},
                    "strategy": {"linear": {}},
                }
            ],
        }
    )
    nodes = [
        NodeSnapshot(
            name=f"n{i:02}",
            labels={"gpu": "yes", "env": "prod" if i % 3 == 0 else "dev"},
            unschedulable=(i == 4),
            ready=(i != 5),
        )
        for i in range(20)
    ]
    nodes.append(NodeSnapshot(name="cpu-1", labels={"env": "prod"}))  # not targeted
    p = plan(nodes, spec)
    assert p.targeted == 20
    prod, default = p.compartments
    assert prod.name == "prod" and prod.members == [f"n{i:02}" for i in range(0, 20, 3)]
    assert prod.ceiling == 3 and prod.unavailable == []
    assert [len(b.nodes) for b in prod.batches] == [1, 2, 3, 1]
    assert prod.worst_case_out_of_service == 3
    assert default.name == DEFAULT_COMPARTMENT and len(default.members) == 13
    assert default.unavailable == ["n04", "n05"]  # cordoned by someone, NotReady
    assert default.ceiling == 6  # 50% of 13
    # The strategy asks 1, 2, 4, then 8 clamped to the 6 remaining; the cap leaves 6 - 2 = 4.
    assert [b.strategy_size for b in default.batches] == [1, 2, 4, 6, 2]
    assert [len(b.nodes) for b in default.batches] == [1, 2, 4, 4, 2]
    assert default.worst_case_out_of_service == 6
    assert functools.reduce(operator.iadd, (b.nodes for b in default.batches), []) == default.members
    assert p.worst_case_out_of_service == 9
    assert p.package_order == ["driver", "tuned"]
    assert p.interrupt == Interrupt(type="reboot")
    assert p.warnings == []


def test_plan_reports_a_blocked_compartment():
    spec = rollout(deploymentPolicy={"default": {"budget": {"count": 2}, "strategy": {"fixed": {}}}})
    nodes = [NodeSnapshot(name=f"n{i}", labels={"gpu": "yes"}, unschedulable=i < 2) for i in range(5)]
    (default,) = plan(nodes, spec).compartments
    assert default.batches == [] and default.blocked and "2 of 5 nodes already out of service" in default.blocked
    assert default.worst_case_out_of_service == 2
    assert any("__default__" in w for w in plan(nodes, spec).warnings)


def test_plan_default_is_one_node_at_a_time_and_selectors_filter():
    spec = rollout()
    nodes = [NodeSnapshot(name=f"n{i}", labels={"gpu": "yes" if i % 2 else "no"}) for i in range(6)]
    p = plan(nodes, spec)
    (default,) = p.compartments
    assert default.members == ["n1", "n3", "n5"]
    assert [b.nodes for b in default.batches] == [["n1"], ["n3"], ["n5"]]
    assert p.worst_case_out_of_service == 1


def test_plan_all_nodes_and_empty_compartments():
    spec = rollout(
        nodeSelectors={},
        allNodes=True,
        deploymentPolicy={
            "default": {"budget": {"count": 1}, "strategy": {"fixed": {}}},
            "compartments": [{"name": "empty", "selector": {"matchLabels": {"nope": "x"}}, "budget": {"count": 1}}],
        },
    )
    p = plan([NodeSnapshot(name="a"), NodeSnapshot(name="b", labels={"x": "y"})], spec)
    assert p.targeted == 2
    assert "compartment 'empty' has no node" in p.warnings
    assert plan([], spec).warnings[0] == "the node selectors match no node"


# ---------------------------------------------------------------- properties

KEYS = ["env", "zone", "rack"]
VALUES = ["a", "b", "c"]
labels_st = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)
params = dict(
    initial_batch=st.integers(1, 12),
    batch_threshold=st.integers(1, 100),
    failure_threshold=st.none() | st.integers(1, 4),
    safety_limit=st.integers(1, 100),
)
strategy_st = st.one_of(
    st.builds(lambda p: Strategy(fixed=p), st.builds(FixedStrategy, **params)),
    st.builds(lambda p: Strategy(linear=p), st.builds(LinearStrategy, delta=st.integers(1, 5), **params)),
    st.builds(
        lambda p: Strategy(exponential=p), st.builds(ExponentialStrategy, growth_factor=st.integers(2, 4), **params)
    ),
)
budget_st = st.one_of(st.builds(Budget, percent=st.integers(1, 100)), st.builds(Budget, count=st.integers(1, 15)))


@st.composite
def policies(draw) -> DeploymentPolicy:
    selectors = draw(
        st.lists(
            st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), min_size=1, max_size=2),
            max_size=4,
            unique_by=lambda d: tuple(sorted(d.items())),
        )
    )
    compartments = [
        Compartment(
            name=f"c{i}",
            selector=LabelSelector(match_labels=sel),
            budget=draw(budget_st),
            strategy=draw(st.none() | strategy_st),
        )
        for i, sel in enumerate(selectors)
    ]
    return DeploymentPolicy(
        default=PolicyDefault(budget=draw(budget_st), strategy=draw(strategy_st)), compartments=compartments
    )


@st.composite
def node_lists(draw) -> list[NodeSnapshot]:
    n = draw(st.integers(0, 30))
    return [
        NodeSnapshot(
            name=f"n{i:02}",
            labels=draw(labels_st),
            unschedulable=draw(st.integers(0, 4)) == 0,
            ready=draw(st.integers(0, 9)) > 0,
        )
        for i in range(n)
    ]


@PROPS
@given(node_lists(), policies())
def test_every_node_in_exactly_one_compartment(nodes, policy):
    assignment = assign_compartments(nodes, policy)
    placed = [m for members in assignment.values() for m in members]
    assert sorted(placed) == sorted(n.name for n in nodes)
    assert set(assignment) == {c.name for c in policy.compartments} | {DEFAULT_COMPARTMENT}
    by_name = {n.name: n for n in nodes}
    for name, members in assignment.items():
        for m in members:
            matching = [c for c in policy.compartments if c.selector.matches(by_name[m].labels)]
            if name == DEFAULT_COMPARTMENT:
                assert matching == []
            else:
                assert name in {c.name for c in matching}
                assert strategy_rank(next(c for c in matching if c.name == name).strategy) == min(
                    strategy_rank(c.strategy) for c in matching
                )


@PROPS
@given(st.none() | strategy_st, st.integers(1, 200), st.data())
def test_batch_size_at_least_1_and_at_most_remaining(strategy, total, data):
    completed = data.draw(st.integers(0, total - 1))
    failed = data.draw(st.integers(0, total - 1 - completed))
    state = BatchState(
        completed_nodes=completed,
        failed_nodes=failed,
        last_batch_size=data.draw(st.integers(0, total)),
        last_batch_failed=data.draw(st.booleans()),
    )
    cap = data.draw(st.integers(1, total))
    size = next_batch_size(strategy, state, total, cap)
    assert 1 <= size <= total - completed - failed


@PROPS
@given(st.integers(0, 500), st.integers(0, 500), st.integers(0, 500))
def test_admissible_never_exceeds_ceiling_minus_unavailable(batch, cap, unavailable):
    a = admissible(batch, cap, unavailable)
    assert 0 <= a <= batch
    assert a <= max(0, cap - unavailable)
    assert a == batch or a == max(0, cap - unavailable)


@PROPS
@given(st.data())
def test_admit_puts_no_more_out_of_service_than_the_ceiling_allows(data):
    order = data.draw(st.lists(st.sampled_from("abcdefgh"), unique=True))
    unavailable = data.draw(st.sets(st.sampled_from("abcdefghxyz")))
    batch, cap = data.draw(st.integers(0, 10)), data.draw(st.integers(0, 10))
    chosen = admit(order, unavailable, batch, cap)
    new = [n for n in chosen if n not in unavailable]
    assert len(chosen) <= batch and chosen == [n for n in order if n in chosen]
    assert len(new) <= max(0, cap - len(unavailable))
    # Never fewer than the count rule admits, and never empty while a node due is out of service.
    assert len(chosen) >= min(len(order), admissible(batch, cap, len(unavailable)))
    assert chosen or batch == 0 or not set(order) & unavailable


@PROPS
@given(node_lists(), policies(), st.booleans())
def test_plan_worst_case_never_exceeds_a_ceiling(nodes, policy, all_nodes):
    spec = RolloutInput(
        cluster="lab",
        name="p",
        all_nodes=all_nodes,
        node_selectors=LabelSelector() if all_nodes else LabelSelector(match_labels={"zone": "a"}),
        packages={"pk": Package(version="1.0.0", image="x/pk")},
        deployment_policy=policy,
    )
    p = plan(nodes, spec)
    assert sum(len(c.members) for c in p.compartments) == p.targeted
    for c in p.compartments:
        planned = [m for b in c.batches for m in b.nodes]
        assert planned == c.members[: len(planned)]
        assert all(len(b.nodes) >= 1 for b in c.batches)
        assert all(len(b.nodes) + len(c.unavailable) <= c.ceiling for b in c.batches)
        if c.batches:
            assert c.worst_case_out_of_service <= c.ceiling
        if c.blocked is None:
            assert planned == c.members
        else:
            assert len(c.unavailable) >= c.ceiling
    assert p.worst_case_out_of_service == sum(c.worst_case_out_of_service for c in p.compartments)


outcomes_st = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=25)


@PROPS
@given(strategy_st, outcomes_st, st.integers(1, 100))
def test_stop_rule_never_fires_without_a_failure_threshold(strategy, outcomes, total):
    params_ = strategy.params.model_copy(update={"failure_threshold": None})
    strategy = Strategy(**{strategy.kind: params_})
    state = BatchState()
    for succeeded, failed in outcomes:
        state = evaluate_batch(strategy, state, succeeded, failed, total)
        assert not state.should_stop


@PROPS
@given(strategy_st, outcomes_st, st.integers(1, 100))
def test_with_the_safe_safety_limit_enough_failures_always_stop(strategy, outcomes, total):
    threshold = strategy.params.failure_threshold or 1
    strategy = Strategy(
        **{strategy.kind: strategy.params.model_copy(update={"failure_threshold": threshold, "safety_limit": 100})}
    )
    state = BatchState()
    for succeeded, failed in outcomes:
        state = evaluate_batch(strategy, state, succeeded, failed, total)
        if state.consecutive_failures >= threshold and progress_percent(state, total) < 100:
            assert state.should_stop


@PROPS
@given(st.none() | strategy_st, budget_st, st.integers(1, 60), st.integers(0, 10), st.randoms(use_true_random=False))
def test_simulated_rollout_respects_cap_and_terminates(strategy, budget, total, unavailable, rnd):
    cap = ceiling(budget, total)
    state = BatchState()
    for _ in range(total + 1):
        if state.should_stop or state.completed_nodes + state.failed_nodes >= total:
            break
        size = admissible(next_batch_size(strategy, state, total, cap), cap, unavailable)
        if size == 0:
            assert unavailable >= cap
            break
        assert size + unavailable <= cap
        failed = rnd.randint(0, size)
        state = evaluate_batch(strategy, state, size - failed, failed, total)
        assert state.completed_nodes + state.failed_nodes <= total
    else:
        pytest.fail("did not terminate")


@st.composite
def windows_st(draw) -> MaintenanceWindow:
    start = draw(st.integers(0, 23))
    end = draw(st.integers(0, 24).filter(lambda e: e != start))
    return MaintenanceWindow(
        days=draw(st.lists(st.sampled_from(["mon", "wed", "sat"]), min_size=1, unique=True)),
        start_hour=start,
        end_hour=end,
        time_zone=draw(st.sampled_from(["UTC", "Europe/Paris", "Asia/Kolkata", "America/New_York"])),
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(windows_st(), min_size=1, max_size=2),
    st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(UTC)),
)
def test_next_window_open_is_open_and_the_first(windows, at):
    nxt = next_window_open(windows, at)
    assert nxt is not None and nxt >= at and window_open(windows, nxt)
    if nxt != at:
        assert not window_open(windows, at)
        assert not window_open(windows, nxt - timedelta(minutes=15)) or nxt - timedelta(minutes=15) < at
