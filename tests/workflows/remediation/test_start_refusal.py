"""NodeRemediation's start decides on fresh facts (workflows/remediation/policy.py `start_refusal`): the node it reads
at its start is refused when quarantined, opted out or cooling down (the sweep's own rule, `left_alone`), or when
Millwright wrote on it after the sweep decided; an operator's explicit request goes ahead. Pure: no Temporal."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from activities.node_health import LastRemediation
from tests.workflows.remediation.test_safety_policy import CHECKS, NOW, SICK, node
from workflows.remediation.models import NodeRemediationInput
from workflows.remediation.policy import OPT_OUT_LABEL, DecidedFrom, decide, start_refusal

OURS = "remediation/lab/gpu-01"
HOUR = timedelta(hours=1)
EARLIER = LastRemediation(at=NOW - timedelta(days=2), by=OURS, outcome="healthy")


def test_the_start_refuses_what_the_sweep_would_leave_alone():
    quarantined = node(conditions=SICK, quarantined="PCIe link degraded")
    assert start_refusal(quarantined, NOW, HOUR, None, None) == (
        "quarantined (PCIe link degraded): waiting for an operator"
    )
    assert start_refusal(node(conditions=SICK, labels={OPT_OUT_LABEL: "false"}), NOW, HOUR, None, None) == (
        "opted out of automated remediation (millwright.dev/remediation=false)"
    )
    recent = LastRemediation(at=NOW - timedelta(seconds=40), by=OURS, outcome="quarantined")
    assert start_refusal(node(last_remediation=recent), NOW, HOUR, None, None) == (
        "cooling down: remediated 40s ago (quarantined), not again before 2026-12-01T12:59:20+00:00 (cooldown 60m)"
    )
    assert start_refusal(node(last_remediation=recent), NOW, timedelta(0), None, None) is None  # no cooldown
    assert start_refusal(node(last_remediation=EARLIER), NOW, HOUR, None, None) is None
    assert start_refusal(node(conditions=SICK), NOW, HOUR, None, None) is None


def test_an_operators_request_goes_ahead_whatever_the_node_says():
    recent = LastRemediation(at=NOW - timedelta(seconds=40), by=OURS, outcome="quarantined")
    stale = DecidedFrom(at=NOW - timedelta(minutes=1))
    for n in (node(quarantined="exhausted", last_remediation=recent), node(labels={OPT_OUT_LABEL: "false"})):
        assert start_refusal(n, NOW, HOUR, None, None) is not None
        assert start_refusal(n, NOW, HOUR, stale, "alice") is None


def test_a_decision_overtaken_by_millwrights_own_writes_is_refused():
    decided = DecidedFrom(at=NOW - timedelta(minutes=2), cordoned_by=None, last_remediation=EARLIER)
    unchanged = node(conditions=SICK, last_remediation=EARLIER)
    assert start_refusal(unchanged, NOW, timedelta(0), decided, None) is None

    # Another run ended (healthy, so not quarantined) after the sweep read the node; no cooldown to catch it.
    marked = LastRemediation(at=NOW - timedelta(seconds=30), by=OURS, outcome="healthy")
    assert start_refusal(node(last_remediation=marked), NOW, timedelta(0), decided, None) == (
        "decided by a sweep at 2026-12-01T11:58:00+00:00 from older facts: since, the node was marked remediated "
        "(healthy) at 2026-12-01T11:59:30+00:00 by remediation/lab/gpu-01"
    )
    # Another run gave up and left its cordon, with no mark.
    cordoned = node(conditions=SICK, last_remediation=EARLIER, unschedulable=True, cordoned_by=OURS)
    assert start_refusal(cordoned, NOW, timedelta(0), decided, None) == (
        "decided by a sweep at 2026-12-01T11:58:00+00:00 from older facts: since, the node was cordoned by "
        "remediation/lab/gpu-01"
    )
    # The same cordon seen by the sweep (its run still going then) is no news; nor is someone else's (the cordon step
    # leaves that node to them).
    seen_cordoned = decided.model_copy(update={"cordoned_by": OURS})
    assert start_refusal(cordoned, NOW, timedelta(0), seen_cordoned, None) is None
    rollout = node(conditions=SICK, last_remediation=EARLIER, unschedulable=True, cordoned_by="rollout/lab/r1")
    assert start_refusal(rollout, NOW, timedelta(0), decided, None) is None


def test_a_remediate_decision_carries_the_marks_it_saw():
    n = node(conditions=SICK, last_remediation=EARLIER, unschedulable=True, cordoned_by=OURS)
    d = decide("lab", n, CHECKS, NOW, cooldown=HOUR)
    assert d.action == "remediate"
    assert d.decided_from == DecidedFrom(at=NOW, cordoned_by=OURS, last_remediation=EARLIER)
    assert decide("lab", node(), CHECKS, NOW).decided_from is None  # healthy: nothing to re-check


@given(
    quarantined=st.booleans(),
    opted_out=st.booleans(),
    cordoned_by=st.sampled_from([None, OURS]),
    minutes_ago=st.one_of(st.none(), st.integers(0, 180)),
    cooldown_minutes=st.integers(0, 120),
)
def test_a_run_started_from_a_decision_at_once_is_refused_exactly_when_the_sweep_would_skip(
    quarantined, opted_out, cordoned_by, minutes_ago, cooldown_minutes
):
    last = None if minutes_ago is None else LastRemediation(at=NOW - timedelta(minutes=minutes_ago), outcome="failed")
    n = node(conditions=SICK, quarantined="exhausted" if quarantined else None,
             labels={OPT_OUT_LABEL: "false"} if opted_out else {}, unschedulable=cordoned_by is not None,
             cordoned_by=cordoned_by, last_remediation=last)  # fmt: skip
    cooldown = timedelta(minutes=cooldown_minutes)
    d = decide("lab", n, CHECKS, NOW, cooldown=cooldown)
    refusal = start_refusal(n, NOW, cooldown, d.decided_from, None)
    assert (d.action == "remediate") == (refusal is None)
    if d.action == "skip":
        assert refusal == d.note  # one rule, said the same way


def test_the_inputs_say_what_is_wrong():
    inp = NodeRemediationInput(cluster="lab", node="gpu-01", reason="r")
    assert inp.cooldown == HOUR and inp.requested_by is None and inp.decided_from is None
    with pytest.raises(ValidationError, match="cooldown"):
        NodeRemediationInput(cluster="lab", node="gpu-01", reason="r", cooldown=-1)
    with pytest.raises(ValidationError, match="requested_by"):
        NodeRemediationInput(cluster="lab", node="gpu-01", reason="r", requested_by="")
    with pytest.raises(ValidationError, match=re.escape("decided_from.at")):
        NodeRemediationInput.model_validate({"cluster": "lab", "node": "gpu-01", "reason": "r", "decided_from": {}})
