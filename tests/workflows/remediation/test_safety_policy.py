"""The remediation safety rails as pure decisions (no Temporal, no cluster): min_healthy, the circuit breaker's
book, the per-node cooldown and the opt-out label; with property tests (hypothesis) for the invariants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from activities.node_health import LastRemediation, NodeHealth, node_health
from workflows.budget.breaker import Breaker, BreakerReset, BreakerSettings
from workflows.remediation.models import RemediationSettings
from workflows.remediation.policy import OPT_OUT_LABEL, HealthChecks, MinHealthy, decide, too_few_healthy
from workflows.remediation.sweep_models import FleetHealthSweepInput

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CHECKS = HealthChecks()
SICK = {"KernelDeadlock": {"status": "True"}}


def node(name: str = "gpu-01", **kw) -> NodeHealth:
    return NodeHealth(name=name, ready=True, ready_since=NOW - timedelta(days=1), **kw)


# ---------------------------------------------------------------- min_healthy


def test_min_healthy_is_node_healthchecks_51_percent_rounded_up():
    default = FleetHealthSweepInput(clusters=["lab"]).min_healthy
    assert default == MinHealthy(percent=51) and default.nodes(8) == 5 and default.nodes(10) == 6
    assert too_few_healthy(5, 8, default) is None
    why = too_few_healthy(4, 8, default)
    assert why == "only 4 of 8 nodes healthy, fewer than min_healthy 51% (5): no remediation in this cluster"
    assert too_few_healthy(0, 3, MinHealthy(percent=0)) is None  # switched off
    assert too_few_healthy(2, 3, MinHealthy(count=3)) is not None


@pytest.mark.parametrize(
    "bad", [{}, {"percent": 51, "count": 3}, {"percent": 101}, {"count": -1}, {"percent": 5, "x": 1}]
)
def test_min_healthy_is_validated(bad):
    with pytest.raises(ValidationError):
        FleetHealthSweepInput(clusters=["lab"], min_healthy=bad)


@given(total=st.integers(0, 10_000), healthy=st.integers(0, 10_000), percent=st.integers(0, 100))
def test_min_healthy_refuses_exactly_below_the_share(total, healthy, percent):
    healthy = min(healthy, total)
    refused = too_few_healthy(healthy, total, MinHealthy(percent=percent)) is not None
    assert refused == (healthy * 100 < percent * total)
    if not refused and healthy < total:  # more healthy nodes never refuse where fewer did not
        assert too_few_healthy(healthy + 1, total, MinHealthy(percent=percent)) is None


# ---------------------------------------------------------------- the breaker's book


def test_the_breaker_trips_past_half_of_the_nodes_within_the_window_and_a_reset_closes_it():
    b, s = Breaker(), BreakerSettings()
    assert (s.max_percent, s.window) == (50, timedelta(minutes=5))  # NVSentinel's defaults
    assert b.admit("n1", "r/1", 6, s, NOW) is None
    assert b.admit("n1", "r/1b", 6, s, NOW) is None  # the same node again costs nothing
    assert b.admit("n2", "r/2", 6, s, NOW) is None and b.admit("n3", "r/3", 6, s, NOW) is None
    why = b.admit("n4", "r/4", 6, s, NOW)
    assert b.tripped and why and "took 3 of 6 nodes out of service within 5m; n4 too" in why and "reset_breaker" in why
    assert b.admit("n1", "r/1", 6, s, NOW + timedelta(hours=3)) == why  # never resets by itself
    assert (b.trips, b.refused) == (1, 2)
    b.clear(BreakerReset(by="ops", reason="a bad driver rolled back"), NOW)
    assert not b.tripped and b.taken == [] and "by ops: a bad driver rolled back" in b.reset
    assert b.admit("n4", "r/4", 6, s, NOW) is None


def test_nodes_taken_longer_ago_than_the_window_no_longer_count():
    b, s = Breaker(), BreakerSettings(window=timedelta(minutes=5))
    for i in range(3):
        assert b.admit(f"n{i}", f"r/{i}", 6, s, NOW) is None
    assert b.admit("n3", "r/3", 6, s, NOW + timedelta(minutes=5)) is None
    assert [t.node for t in b.taken] == ["n3"]


@pytest.mark.parametrize(
    "bad", [{"max_percent": 0}, {"max_percent": 101}, {"window": 0}, {"window": -5}, {"max_percent": 50, "windows": 5}]
)
def test_breaker_settings_are_validated(bad):
    with pytest.raises(ValidationError):
        RemediationSettings(breaker=bad)
    with pytest.raises(ValidationError):
        BreakerReset(by="ops", reason="")


@given(total=st.integers(1, 300), percent=st.integers(1, 100),
       nodes=st.lists(st.integers(0, 299), min_size=1, max_size=400))  # fmt: skip
def test_the_breaker_never_lets_remediation_take_more_than_its_share(total, percent, nodes):
    """Whatever the order (nodes repeat), remediation takes at most max_percent of the nodes within the window;
    once the first node past it is refused, every later one is too."""
    b, s = Breaker(), BreakerSettings(max_percent=percent)
    admitted: set[int] = set()
    refused_from = None
    for i, n in enumerate(n % total for n in nodes):  # a cluster of `total` nodes has no more to remediate
        if b.admit(f"n{n}", f"r/{n}", total, s, NOW) is None:
            assert refused_from is None
            admitted.add(n)
        elif refused_from is None:
            refused_from = i
    assert len(admitted) * 100 <= percent * total
    if refused_from is not None:  # tripped by the first node that would have passed the share
        assert (len(admitted) + 1) * 100 > percent * total and b.tripped
    if percent == 100:
        assert refused_from is None  # 100 %: never trips


# ---------------------------------------------------------------- opt-out label and cooldown


def test_a_node_opted_out_by_label_is_left_alone_but_counted_healthy_when_healthy():
    opted = {OPT_OUT_LABEL: "false"}
    d = decide("lab", node(labels=opted, conditions=SICK), CHECKS, NOW)
    assert d.action == "skip" and d.note == "opted out of automated remediation (millwright.dev/remediation=false)"
    assert d.reasons == ["KernelDeadlock"]
    assert decide("lab", node(labels=opted), CHECKS, NOW).action == "healthy"
    assert decide("lab", node(labels={OPT_OUT_LABEL: "true"}, conditions=SICK), CHECKS, NOW).action == "remediate"
    assert OPT_OUT_LABEL in CHECKS.label_keys() and OPT_OUT_LABEL in HealthChecks(gpu_health_label=None).label_keys()


def test_a_node_remediated_within_the_cooldown_waits():
    recent = LastRemediation(at=NOW - timedelta(minutes=20), by="remediation/lab/gpu-01", outcome="healthy")
    d = decide("lab", node(conditions=SICK, last_remediation=recent), CHECKS, NOW, cooldown=timedelta(hours=1))
    assert d.action == "skip"
    assert d.note == (
        "cooling down: remediated 20m ago (healthy), not again before 2026-12-01T12:40:00+00:00 (cooldown 60m)"
    )
    assert decide("lab", node(conditions=SICK, last_remediation=recent), CHECKS, NOW,
                  cooldown=timedelta(minutes=20)).action == "remediate"  # fmt: skip
    assert decide("lab", node(conditions=SICK, last_remediation=recent), CHECKS, NOW).action == "remediate"  # 0: off
    assert FleetHealthSweepInput(clusters=["lab"]).cooldown == timedelta(hours=1)
    with pytest.raises(ValidationError):
        FleetHealthSweepInput(clusters=["lab"], cooldown=-1)


def test_the_last_remediation_annotation_is_read_and_an_unreadable_one_ignored():
    def obj(value: str) -> dict:
        return {"metadata": {"name": "gpu-01", "annotations": {"millwright.dev/last-remediation": value}},
                "status": {"conditions": []}}  # fmt: skip

    h = node_health(obj('{"at":"2026-12-01T11:00:00Z","by":"remediation/lab/gpu-01","outcome":"quarantined"}'),
                    [], [])  # fmt: skip
    assert h.last_remediation == LastRemediation(at=NOW - timedelta(hours=1), by="remediation/lab/gpu-01",
                                                 outcome="quarantined")  # fmt: skip
    assert node_health(obj("yesterday"), [], []).last_remediation is None
