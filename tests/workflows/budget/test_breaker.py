"""The remediation circuit breaker the disruption budget entity holds, on a real dev server against the Kubernetes
emulator: remediation's requests trip it past half of the cluster's nodes, nothing else does; it shows in the
workflow list (MillwrightPhase), in its gauge and in the current details; only a validated `reset_breaker` closes
it; it survives continue-as-new, and a tripped entity does not close while idle."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from starter.questions import current_details
from tests.kube_helpers import wait_for
from tests.workflows.budget.test_budget_signals import worker_on
from tests.workflows.budget.test_disruption_budget import small_fleet, start_budget
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.budget.breaker import BreakerReset, BreakerSettings
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import LeaseRelease, LeaseRequest

pytestmark = pytest.mark.timeout(180)
REMEDIATION = BreakerSettings()  # NVSentinel's 50 % within 5 minutes


async def holders(client, worker, n: int) -> list[str]:
    """Running workflows to hold leases (so the entity keeps them): idle entities of clusters of their own."""
    return [(await start_budget(client, worker, {"count": 1}, cluster=f"holder-{i}")).id for i in range(1, n + 1)]


def acquire(entity, node: str, holder: str, remediation: BreakerSettings | None = REMEDIATION):
    return entity.execute_update(DisruptionBudget.acquire,
                                 LeaseRequest(node=node, holder=holder, remediation=remediation))  # fmt: skip


async def test_remediation_past_half_the_nodes_trips_the_breaker_until_an_operator_resets_it(
        client, temporal_address, k8s, kubeconfig_path):  # fmt: skip
    await k8s.seed(small_fleet())  # node-01 .. node-05
    metrics = MetricBuffer(10_000)
    metered = await Client.connect(temporal_address, namespace=client.namespace, data_converter=pydantic_data_converter,
                                   runtime=Runtime(telemetry=TelemetryConfig(metrics=metrics)))  # fmt: skip
    tripped_gauge: list[float] = []

    async def gauge_at(value: int) -> bool:
        tripped_gauge.extend(u.value for u in metrics.retrieve_updates()
                             if u.metric.name == "millwright_remediation_breaker_tripped"
                             and u.attributes.get("cluster") == "lab")  # fmt: skip
        return bool(tripped_gauge) and tripped_gauge[-1] == value

    async with worker_on(metered, kubeconfig_path) as worker:
        entity = await start_budget(metered, worker, {"count": 5})
        h = await holders(metered, worker, 5)
        # Two of five nodes is 40 %: granted. A third would be 60 %: refused, and the breaker trips.
        assert [(await acquire(entity, f"node-0{i}", h[i - 1])).state for i in (1, 2)] == ["granted", "granted"]
        refused = await acquire(entity, "node-03", h[2])
        assert refused.state == "refused"
        assert "took 2 of 5 nodes out of service within 5m; node-03 too would be more than 50%" in refused.note
        assert "reset_breaker" in refused.note
        # Nothing but remediation trips it or is refused by it: a maintenance still gets its lease.
        assert (await acquire(entity, "node-04", h[3], remediation=None)).state == "granted"
        # Every later remediation is refused at once, whatever the budget says.
        assert (await acquire(entity, "node-05", h[4])).state == "refused"
        view = await entity.query(DisruptionBudget.breaker)
        assert view.enabled and view.tripped and view.trips == 1 and view.refused == 2
        assert sorted(t.node for t in view.taken) == ["node-01", "node-02"]
        assert "remediation circuit breaker tripped at" in await current_details(entity)

        async def listed(phase: str):
            query = f"WorkflowId = '{entity.id}' AND MillwrightPhase = '{phase}' AND ExecutionStatus = 'Running'"
            return [w async for w in metered.list_workflows(query)] or None

        await wait_for(lambda: listed("breaker-tripped"), what="the tripped breaker in the workflow list")
        await wait_for(lambda: gauge_at(1), what="the breaker's gauge at 1")

        # The reset is an operator control: a reason, nothing unknown.
        for bad in ({"by": "ops"}, {"by": "ops", "reason": ""}, {"by": "ops", "reason": "x", "force": True}):
            with pytest.raises(WorkflowUpdateFailedError):
                await entity.execute_update("reset_breaker", bad)
        assert (await entity.query(DisruptionBudget.breaker)).tripped
        why = "the NPD config was wrong; fixed"
        reset = await entity.execute_update(DisruptionBudget.reset_breaker, BreakerReset(by="ops", reason=why))
        assert not reset.tripped and reset.taken == [] and f"by ops: {why}" in reset.reset
        # Remediation resumes.
        assert (await acquire(entity, "node-03", h[2])).state == "granted"
        await wait_for(lambda: listed("serving"), what="the closed breaker in the workflow list")
        await wait_for(lambda: gauge_at(0), what="the breaker's gauge back at 0")
        await record_history(entity, "disruption_budget_breaker")
        for workflow_id in [entity.id, *h]:
            await metered.get_workflow_handle(workflow_id).terminate("test over")


async def decided(client, workflow_id: str, node: str, holder: str) -> str:
    """Ask (the latest run, whichever it is) until decided: a run continuing as new answers 'queued', and the
    requester asks again, as a holder on the update path does."""
    while True:
        lease = await acquire(client.get_workflow_handle(workflow_id), node, holder)
        if lease.state != "queued":
            return lease.state


async def test_a_tripped_breaker_survives_continue_as_new_and_keeps_the_entity_from_closing(
        small_history_env, k8s, kubeconfig_path):  # fmt: skip
    await k8s.seed(small_fleet())
    client = small_history_env.client
    async with worker_on(client, kubeconfig_path) as worker:
        entity = await start_budget(client, worker, {"count": 5}, idle_close_after=timedelta(seconds=1))
        h = await holders(client, worker, 3)
        for i in (1, 2):
            assert await decided(client, entity.id, f"node-0{i}", h[i - 1]) == "granted"
        assert await decided(client, entity.id, "node-03", h[2]) == "refused"
        first_run = (await client.get_workflow_handle(entity.id).describe()).run_id

        async def continued():
            return (await client.get_workflow_handle(entity.id).describe()).run_id != first_run

        await wait_for(continued, what="the entity continuing as new", timeout=60)
        latest = client.get_workflow_handle(entity.id)
        view = await latest.query(DisruptionBudget.breaker)
        assert view.tripped and sorted(t.node for t in view.taken) == ["node-01", "node-02"]
        assert await decided(client, entity.id, "node-04", h[2]) == "refused"
        # Nothing leased or waiting: a tripped breaker keeps the entity running (visible, and answering).
        for i in (1, 2):
            await latest.execute_update(DisruptionBudget.release, LeaseRelease(node=f"node-0{i}", holder=h[i - 1]))
        state = await latest.query(DisruptionBudget.state)
        assert state.leases == [] and state.queue == []
        await asyncio.sleep(2)  # twice its idle_close_after
        assert (await latest.describe()).status == WorkflowExecutionStatus.RUNNING
        await latest.execute_update(DisruptionBudget.reset_breaker, BreakerReset(by="ops", reason="checked"))

        async def closed():
            described = await client.get_workflow_handle(entity.id).describe()
            return described.status == WorkflowExecutionStatus.COMPLETED

        # Reset, it closes once idle (its idle_close_after is 1 s); it had stayed open while tripped.
        await wait_for(closed, what="the idle entity closing once reset", timeout=30)
        for workflow_id in h:
            await client.get_workflow_handle(workflow_id).terminate("test over")
