"""The control-plane boundary of the disruption budget (workflows/budget/control_plane.py): the pure rule, then the
entity and a rollout on a real dev server against the Kubernetes emulator, judged from its audit log."""

from __future__ import annotations

import asyncio

import pytest

from activities.kube.models import CONTROL_PLANE_LABEL
from lab.fleet import Fleet
from tests.workflows.budget.test_breaker import acquire, holders
from tests.workflows.budget.test_disruption_budget import budget_state, start_budget
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import max_unavailable, rollout_spec
from tests.workflows.rollout.test_rollout import lab_ready, start
from workflows.budget.budget import Budget
from workflows.budget.control_plane import control_plane_wait
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.models import BudgetChange

pytestmark = pytest.mark.timeout(300)
CP = {"cp-01", "cp-02", "cp-03"}


# ---------------------------------------------------------------- the rule


def test_a_control_plane_node_waits_while_another_is_out_of_service():
    assert control_plane_wait("cp-01", set(), CP, 1) is None
    why = control_plane_wait("cp-02", {"cp-01", "w-01"}, CP, 1)
    assert why is not None and "cp-02 waits while 1 control-plane node (cp-01) is out of service" in why
    assert "at most 1 at once" in why
    # Out of service for any reason counts (NotReady, someone's cordon), whoever holds it.
    assert control_plane_wait("cp-03", {"cp-01"}, CP, 1) is not None


def test_workers_and_nodes_already_out_are_never_held_and_the_setting_relaxes_the_rule():
    assert control_plane_wait("w-01", {"cp-01", "cp-02"}, CP, 1) is None  # not of the control plane
    assert control_plane_wait("cp-02", {"cp-01", "cp-02"}, CP, 1) is None  # already out: costs nothing
    assert control_plane_wait("cp-02", {"cp-01"}, CP, 2) is None
    why = control_plane_wait("cp-03", {"cp-01", "cp-02"}, CP, 2)
    assert why is not None and "2 control-plane nodes (cp-01, cp-02) are out of service; at most 2" in why


# ---------------------------------------------------------------- on the entity and in a rollout


def fleet() -> list[dict]:
    """cp-01..03 labelled control-plane, w-01..03 workers, all `gpu=true` (what rollout_spec selects)."""
    nodes = [
        {"prefix": "cp-", "count": 3, "labels": {"gpu": "true", CONTROL_PLANE_LABEL: ""}},
        {"prefix": "w-", "count": 3, "labels": {"gpu": "true"}},
    ]
    workloads = [{"name": "dcgm-exporter", "kind": "DaemonSet", "namespace": "gpu-operator", "labels": {"app": "d"}}]
    return Fleet.model_validate({"cluster": "lab", "nodes": nodes, "workloads": workloads}).to_objects()


async def test_the_entity_holds_a_second_control_plane_node_until_relaxed(client, kube_worker, k8s):
    await k8s.seed(fleet())
    entity = await start_budget(client, kube_worker, {"count": 3})
    h = await holders(client, kube_worker, 3)
    assert (await acquire(entity, "cp-01", h[0], remediation=None)).state == "granted"
    held = await acquire(entity, "cp-02", h[1], remediation=None)
    assert held.state == "queued" and "control-plane node cp-02 waits while 1 control-plane node (cp-01)" in held.note
    # A worker behind it is not held up: the budget (3) has room.
    assert (await acquire(entity, "w-01", h[2], remediation=None)).state == "granted"
    state = await budget_state(entity)
    assert [lease.node for lease in state.queue] == ["cp-02"] and state.control_plane_at_once == 1
    # The cluster's setting relaxes it, explicitly and recorded.
    change = BudgetChange(budget=Budget(count=3), control_plane_at_once=2, by="sre", reason="5-member etcd")
    view = await entity.execute_update(DisruptionBudget.set_budget, change)
    assert view.control_plane_at_once == 2 and view.budget_source == "operator sre: 5-member etcd"
    assert (await acquire(entity, "cp-02", h[1], remediation=None)).state == "granted"
    for workflow_id in h:
        await client.get_workflow_handle(workflow_id).terminate("test over")


async def test_a_rollout_with_a_budget_of_3_takes_control_plane_nodes_one_at_a_time(client, kube_worker, k8s):
    await lab_ready(k8s, fleet())
    entity = await start_budget(client, kube_worker, {"count": 3})
    policy = {"default": {"budget": {"count": 3}, "strategy": {"fixed": {"initialBatch": 3}}}}
    handle = await start(client, kube_worker, rollout_spec("control-plane", policy=policy))
    notes: set[str] = set()

    async def sample() -> None:
        while True:
            notes.update(lease.note for lease in (await budget_state(entity)).queue)
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    try:
        result = await asyncio.wait_for(handle.result(), 240)
    finally:
        sampler.cancel()

    assert result.outcome == "completed" and result.counts == {"complete": 6}
    audit = await k8s.audit()
    assert max_unavailable(audit, CP) == 1, "never two control-plane nodes out of service at once"
    assert max_unavailable(audit, CP | {"w-01", "w-02", "w-03"}) <= 3
    assert any("control-plane node" in n and "waits while" in n for n in notes), notes  # it waited, visibly
    await record_history(entity, "disruption_budget_control_plane")
