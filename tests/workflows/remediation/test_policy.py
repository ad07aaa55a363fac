"""The pure decision: which nodes need remediation, and why (no Temporal, no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from activities.node_health import ConditionState, NodeHealth, node_health
from workflows.remediation.policy import AgentObservation, BmcObservation, HealthChecks, decide, remediation_workflow_id

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CHECKS = HealthChecks()


def node(name: str = "gpu-01", *, ready: bool = True, down_for: timedelta | None = None, **kw) -> NodeHealth:
    since = NOW - down_for if down_for is not None else NOW - timedelta(days=1)
    return NodeHealth(name=name, ready=ready, ready_since=since, **kw)


def cond(status: str, reason: str = "") -> ConditionState:
    return ConditionState(status=status, reason=reason)


def test_a_healthy_node_is_left_alone():
    d = decide("lab", node(conditions={"KernelDeadlock": cond("False"), "GpuHealthy": cond("True")}), CHECKS, NOW)
    assert d.action == "healthy" and d.reasons == []


@pytest.mark.parametrize(
    "health, reason",
    [
        (node(ready=False, down_for=timedelta(minutes=10)), "NotReady for 10m"),
        (node(conditions={"KernelDeadlock": cond("True", "DockerHung")}), "KernelDeadlock (DockerHung)"),
        (node(conditions={"GpuHealthy": cond("False", "XidErrors")}), "GpuHealthy=False (XidErrors)"),
        (node(labels={"nvidia.com/gpu.health": "unhealthy"}), "nvidia.com/gpu.health=unhealthy"),
    ],
    ids=["not-ready", "kernel-deadlock", "gpu-condition", "gpu-label"],
)
def test_each_kind_of_problem_is_a_reason(health, reason):
    d = decide("lab", health, CHECKS, NOW)
    assert d.action == "remediate"
    assert d.reasons == [reason]


def test_not_ready_within_the_grace_period_is_not_a_problem_yet():
    d = decide("lab", node(ready=False, down_for=timedelta(seconds=30)), CHECKS, NOW)
    assert d.action == "healthy"
    assert "NotReady for 30s, within the 5m grace" in d.note
    assert decide("lab", node(ready=False, down_for=timedelta(minutes=5)), CHECKS, NOW).action == "remediate"


def test_readiness_can_be_left_out():
    checks = HealthChecks(ready=False)
    assert decide("lab", node(ready=False, down_for=timedelta(hours=1)), checks, NOW).action == "healthy"


def test_gpu_check_findings_are_problems_and_no_agent_is_unknown_not_unhealthy():
    bad = AgentObservation(status="findings", findings=["remap_pending GPU3: pending row remap"])
    d = decide("lab", node(), CHECKS, NOW, agent=bad)
    assert d.action == "remediate" and d.reasons == ["GPU check: remap_pending GPU3: pending row remap"]

    for status in ("unavailable", "error"):
        d = decide("lab", node(), CHECKS, NOW, agent=AgentObservation(status=status, detail="no agent"))
        assert d.action == "healthy", status
        assert f"host agent {status}" in d.note


def test_bmc_critical_rollup_is_a_problem_and_an_unreachable_bmc_is_unknown():
    d = decide("lab", node(), CHECKS, NOW, bmc=BmcObservation(health="OK", health_rollup="Critical"))
    assert d.action == "remediate" and d.reasons == ["BMC health rollup Critical"]
    assert decide("lab", node(), CHECKS, NOW, bmc=BmcObservation(health_rollup="Warning")).action == "healthy"
    d = decide("lab", node(), CHECKS, NOW, bmc=BmcObservation(status="unavailable", detail="503"))
    assert d.action == "healthy" and "BMC unavailable" in d.note
    warn = HealthChecks(bmc_unhealthy=["Critical", "Warning"])
    assert decide("lab", node(), warn, NOW, bmc=BmcObservation(health_rollup="Warning")).action == "remediate"


def test_several_problems_are_all_listed():
    health = node(ready=False, down_for=timedelta(hours=2), conditions={"KernelDeadlock": cond("True")})
    d = decide(
        "lab",
        health,
        CHECKS,
        NOW,
        agent=AgentObservation(status="findings", findings=["gpu_lost GPU0: x"]),
        bmc=BmcObservation(health="Critical", health_rollup="Critical"),
    )
    assert d.reasons == [
        "NotReady for 2h",
        "KernelDeadlock",
        "GPU check: gpu_lost GPU0: x",
        "BMC health rollup Critical",
    ]


def test_a_quarantined_node_waits_for_an_operator():
    d = decide(
        "lab",
        node(quarantined="remap failure", unschedulable=True, conditions={"GpuHealthy": cond("False")}),
        CHECKS,
        NOW,
    )
    assert d.action == "skip" and "quarantined (remap failure)" in d.note
    assert d.reasons == ["GpuHealthy=False"]


def test_a_node_someone_else_cordoned_is_theirs_but_our_own_cordon_is_resumed():
    sick = {"KernelDeadlock": cond("True")}
    theirs = decide("lab", node(unschedulable=True, cordoned_by="rollout/lab/r1", conditions=sick), CHECKS, NOW)
    assert theirs.action == "skip" and "cordoned by rollout/lab/r1" in theirs.note
    unmarked = decide("lab", node(unschedulable=True, conditions=sick), CHECKS, NOW)
    assert unmarked.action == "skip" and "unmarked cordon" in unmarked.note
    # A remediation that died left its cordon: the next sweep starts it again.
    ours = node(unschedulable=True, cordoned_by=remediation_workflow_id("lab", "gpu-01"), conditions=sick)
    assert decide("lab", ours, CHECKS, NOW).action == "remediate"
    # A cordoned but healthy node is simply healthy.
    assert decide("lab", node(unschedulable=True, cordoned_by="someone"), CHECKS, NOW).action == "healthy"


def test_conditions_and_labels_not_asked_for_are_ignored():
    checks = HealthChecks(problem_conditions=[], gpu_conditions=[], gpu_health_label=None)
    health = node(
        conditions={"KernelDeadlock": cond("True"), "GpuHealthy": cond("False")},
        labels={"nvidia.com/gpu.health": "bad"},
    )
    assert decide("lab", health, checks, NOW).action == "healthy"


def test_node_objects_are_summarised_with_only_what_was_asked_for():
    obj = {
        "metadata": {
            "name": "gpu-07",
            "labels": {"nvidia.com/gpu.health": "unhealthy", "other": "x"},
            "annotations": {
                "millwright.dev/cordoned-by": "remediation/lab/gpu-07",
                "millwright.dev/quarantine": '{"reason": "needs RMA", "by": "x"}',
            },
        },
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-29T11:00:00Z"},
                {"type": "KernelDeadlock", "status": "True", "reason": "AUFSUmountHung"},
                {"type": "MemoryPressure", "status": "False"},
            ],
            "nodeInfo": {"bootID": "b-1"},
        },
    }
    h = node_health(obj, CHECKS.condition_types(), CHECKS.label_keys())
    assert h.ready is False and h.ready_since == datetime(2026, 11, 29, 11, 0, tzinfo=UTC)
    assert set(h.conditions) == {"Ready", "KernelDeadlock"}
    assert h.labels == {"nvidia.com/gpu.health": "unhealthy"}
    assert h.quarantined == "needs RMA" and h.cordoned_by == "remediation/lab/gpu-07" and h.boot_id == "b-1"


def test_the_examples_fit_the_inputs():
    import json
    from pathlib import Path

    from workflows.remediation.models import NodeRemediationInput
    from workflows.remediation.sweep_models import FleetHealthSweepInput

    examples = Path(__file__).parents[3] / "examples"
    node = NodeRemediationInput.model_validate(json.loads((examples / "node-remediation.json").read_text()))
    assert node.workflow_id() == "remediation/lab/gpu-node-03" and node.require_approval_for == ["power-cycle"]
    sweep = FleetHealthSweepInput.model_validate(json.loads((examples / "fleet-health-sweep.json").read_text()))
    assert sweep.workflow_id() == "fleet-health-sweep/lab" and sweep.max_remediations == 2
