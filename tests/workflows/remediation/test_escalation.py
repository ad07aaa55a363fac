"""The pure escalation decision (workflows/remediation/escalation.py): which NVLink domains are remediated whole, and
why (no Temporal, no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from activities.kube.topology import CLIQUE_LABEL, TOPOGRAPH_ACCELERATOR_LABEL, place_of
from activities.node_health import ConditionState, NodeHealth
from activities.prometheus import ECC_DBE_VOLATILE, XID_ERRORS, GpuFault
from workflows.remediation.escalation import (
    FaultyNode,
    RackEscalation,
    RackTally,
    escalations,
    fabric_signs,
    tally,
)
from workflows.remediation.policy import HealthChecks

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
UUID = {"r1": "7b968a6d-c8aa-45e1-9e07-e1e51be99c31", "r2": "0b5c6a2e-bbbb-4d6e-9d1f-000000000002"}
SETTINGS = RackEscalation()


def rack(name: str, size: int = 18) -> list[str]:
    return [f"{name}-n{i:02d}" for i in range(size)]


def labels(node: str, *, clique: bool = True, rack_label: bool = True) -> dict[str, str]:
    r = node.split("-")[0]
    out = {TOPOGRAPH_ACCELERATOR_LABEL: r} if rack_label else {}
    return out | ({CLIQUE_LABEL: f"{UUID[r]}.1"} if clique else {})


def view(nodes: dict[str, dict[str, str]], unhealthy: dict[str, datetime]) -> tuple[list[FaultyNode], dict]:
    """(the unhealthy nodes, every node counted per domain) from each node's labels and when its fault was seen."""
    places = {n: place_of(n, lab) for n, lab in nodes.items()}
    faulty = [FaultyNode(node=n, place=places[n], seen_at=at) for n, at in unhealthy.items()]
    return faulty, tally((places[n], n in unhealthy) for n in nodes)


def test_a_domain_with_half_its_nodes_unhealthy_is_remediated_whole():
    nodes = {n: labels(n) for n in rack("r1") + rack("r2")}
    faulty, counts = view(nodes, {n: NOW for n in rack("r1")[:12]} | {rack("r2")[0]: NOW})
    (found,) = escalations(faulty, counts, SETTINGS)
    assert found.rack == "r1" and found.domain == UUID["r1"]
    assert found.reason == "12 of 18 nodes unhealthy (share 0.5)"
    assert found.nodes == rack("r1")[:12]  # r2's one sick node stays its own remediation's
    assert counts["r1"] == RackTally(nodes=18, unhealthy=12, domain=UUID["r1"])


def test_below_the_share_without_a_fabric_sign_nothing_escalates():
    nodes = {n: labels(n) for n in rack("r1")}
    faulty, counts = view(nodes, {n: NOW for n in rack("r1")[:8]})
    assert escalations(faulty, counts, SETTINGS) == []
    assert escalations(faulty, counts, SETTINGS.model_copy(update={"share": 0.4}))[0].reason == (
        "8 of 18 nodes unhealthy (share 0.4)"
    )


def test_clique_labels_gone_from_several_nodes_within_the_window_is_a_fabric_fault():
    r1 = rack("r1")
    nodes = {n: labels(n, clique=n not in r1[:3]) for n in r1}
    faulty, counts = view(nodes, {r1[0]: NOW, r1[1]: NOW + timedelta(seconds=20), r1[2]: NOW + timedelta(minutes=5)})
    (found,) = escalations(faulty, counts, SETTINGS)
    assert found.reason == "fabric fault: clique label gone from 3 nodes"
    assert found.domain == UUID["r1"]  # the rack's other nodes show it
    # Seen further apart than the window: separate faults, each node its own remediation's.
    apart = [f.model_copy(update={"seen_at": NOW + timedelta(minutes=i)}) for i, f in enumerate(faulty)]
    assert escalations(apart, counts, SETTINGS) == []


def test_a_rack_that_lost_every_clique_label_is_known_by_the_earlier_view():
    r1 = rack("r1", 4)
    nodes = {n: labels(n, clique=False) for n in r1}
    faulty, counts = view(nodes, {r1[0]: NOW, r1[1]: NOW})
    assert counts["r1"].domain == ""  # no node shows the domain now
    assert escalations(faulty, counts, SETTINGS.model_copy(update={"share": 1.0})) == []
    (found,) = escalations(faulty, counts, SETTINGS.model_copy(update={"share": 1.0}), known={"r1": UUID["r1"]})
    assert found.reason == "fabric fault: clique label gone from 2 nodes" and found.domain == UUID["r1"]


def test_both_reasons_are_given():
    r1 = rack("r1", 4)
    nodes = {n: labels(n, clique=n == r1[3]) for n in r1}
    faulty, counts = view(nodes, {n: NOW for n in r1[:3]})
    (found,) = escalations(faulty, counts, SETTINGS)
    assert found.reason == "3 of 4 nodes unhealthy (share 0.5); fabric fault: clique label gone from 3 nodes"


def test_nodes_without_a_rack_key_never_escalate():
    lone = [f"cpu-{i}" for i in range(6)]
    nodes = {n: {} for n in lone}  # no rack label, no clique label: each node a domain of its own
    faulty, counts = view(nodes, {n: NOW for n in lone})
    assert counts == {} and escalations(faulty, counts, SETTINGS) == []


def test_one_sick_node_is_never_a_domain_whatever_its_share():
    nodes = {"r1-n00": labels("r1-n00"), "r1-n01": labels("r1-n01")}
    faulty, counts = view(nodes, {"r1-n00": NOW})
    assert escalations(faulty, counts, SETTINGS) == []  # 1 of 2 is the share, but one node is its own


def test_a_domain_without_a_rack_label_is_named_by_its_nvlink_domain():
    r1 = rack("r1", 4)
    nodes = {n: labels(n, rack_label=False) for n in r1}
    faulty, counts = view(nodes, {n: NOW for n in r1[:2]})
    (found,) = escalations(faulty, counts, SETTINGS)
    assert found.rack == UUID["r1"] and found.reason == "2 of 4 nodes unhealthy (share 0.5)"


def test_nvlink_xids_and_fabric_conditions_are_fabric_signs():
    settings = RackEscalation(fabric_conditions=["NVLinkHealthy", "FabricDown"])
    checks = HealthChecks(gpu_conditions=["GpuHealthy", "NVLinkHealthy"], problem_conditions=["FabricDown"])
    health = NodeHealth(name="r1-n00", ready=True, conditions={"NVLinkHealthy": ConditionState(status="False"),
                                                               "FabricDown": ConditionState(status="True")})  # fmt: skip
    faults = [GpuFault(node="r1-n00", metric=XID_ERRORS, value=145.0, gpu="0"),
              GpuFault(node="r1-n00", metric=XID_ERRORS, value=79.0, gpu="1"),
              GpuFault(node="r1-n00", metric=ECC_DBE_VOLATILE, value=145.0, gpu="2")]  # fmt: skip
    assert fabric_signs(health, settings, checks, faults) == ["NVLinkHealthy=False", "FabricDown=True", "XID 145"]
    assert fabric_signs(health, RackEscalation(), checks) == []

    r1 = rack("r1")
    nodes = {n: labels(n) for n in r1}
    faulty, counts = view(nodes, {n: NOW for n in r1[:2]})
    signed = [f.model_copy(update={"fabric": ["XID 145"]}) for f in faulty]
    (found,) = escalations(signed, counts, SETTINGS)
    assert found.reason == "fabric fault: XID 145 on 2 nodes" and found.nodes == r1[:2]


@pytest.mark.parametrize("change", [{"enabled": False}, {"domain_wide_nodes": 3}], ids=["disabled", "three-needed"])
def test_the_settings_switch_it_off_or_raise_the_bar(change):
    r1 = rack("r1")
    nodes = {n: labels(n, clique=n not in r1[:2]) for n in r1}
    faulty, counts = view(nodes, {n: NOW for n in r1[:2]})
    assert escalations(faulty, counts, SETTINGS)  # two clique labels gone at once
    assert escalations(faulty, counts, SETTINGS.model_copy(update=change)) == []


def test_the_settings_are_checked():
    with pytest.raises(ValueError, match="share"):
        RackEscalation(share=0)
    with pytest.raises(ValueError, match="domain_wide_nodes"):
        RackEscalation(domain_wide_nodes=1)
    with pytest.raises(ValueError, match=r"rack\.power_timeout"):
        RackEscalation.model_validate({"rack": {"power_timeout": 0}})
    assert RackEscalation().label_keys() == [CLIQUE_LABEL, TOPOGRAPH_ACCELERATOR_LABEL]
    assert RackEscalation(enabled=False).label_keys() == []
