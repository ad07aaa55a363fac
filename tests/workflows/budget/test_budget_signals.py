"""The disruption budget's signal protocol: waiting holders that abort or pause, continue-as-new under a
stream of requests, and an entity that follows its requesters to another task queue or closes when idle.

Whether the budget held is judged from the emulator's audit log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from datetime import timedelta

import pytest
from temporalio.client import WorkflowExecutionStatus

from tests.carried_helpers import continued_runs
from tests.kube_helpers import wait_for
from tests.workflows.budget.test_disruption_budget import (
    budget_state,
    maintenance_phase,
    max_out_of_service,
    small_fleet,
    start_budget,
    start_maintenance,
    state_where,
)
from tests.workflows.budget.test_many_holders import history_counts
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS, rollout_fleet, rollout_spec
from workflows.budget.budget import Budget
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import budget_workflow_id
from workflows.budget.models import BudgetChange
from workflows.maintenance.node_maintenance import AbortRequest, NodeMaintenance, SkipWaitRequest
from workflows.rollout.models import ReasonRequest
from workflows.rollout.rollout import Rollout, RolloutBatch

PROTECTED = "millwright.dev/protected=true"

# A worker killed or an API failing under the workflows: replay what they wrote (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("replay_histories")


@contextlib.asynccontextmanager
async def worker_on(client, kubeconfig_path):
    """A worker of every workflow and activity on a task queue of its own."""
    from worker import registry
    from worker.config import WorkerSettings

    registration = registry.build(WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0))
    async with registry.new_worker(client, registration, f"budget-{uuid.uuid4().hex[:8]}") as worker:
        yield worker
    await registration.close()


async def node_writes(k8s, node: str, since: int) -> list[dict]:
    return [e for e in await k8s.audit(since=since, writes=True) if e.get("name") == node]


async def test_abort_while_waiting_for_the_budget_withdraws_the_request(client, kube_worker, k8s):
    await k8s.seed(small_fleet(protected_on="node-01"))
    entity = await start_budget(client, kube_worker, {"count": 1})
    holder = await start_maintenance(client, kube_worker, "node-01", protected_pod_selector=PROTECTED)
    await wait_for(lambda: maintenance_phase(holder, "waiting-for-protected-pods"), what="node-01 held")
    since = await k8s.audit_cursor()
    waiter = await start_maintenance(client, kube_worker, "node-02", uncordon_after=True)
    status = await wait_for(lambda: maintenance_phase(waiter, "waiting-for-budget"), what="node-02 waiting")
    assert "queued #1" in status.note

    await waiter.execute_update(NodeMaintenance.abort, AbortRequest(reason="not today"))
    result = await asyncio.wait_for(waiter.result(), 30)
    assert result.outcome == "aborted" and "waiting for the disruption budget" in result.note
    state = await state_where(entity, lambda s: not s.queue, "the request withdrawn")
    assert [(lease.node, lease.holder) for lease in state.leases] == [("node-01", holder.id)]
    assert await node_writes(k8s, "node-02", since) == []
    await holder.terminate("test over")


async def test_a_paused_rollout_gives_its_place_up_and_asks_again_on_resume(client, kube_worker, k8s, core):
    await k8s.seed(rollout_fleet({"a": 2, "b": 1}, protected_on="b-01"))
    await k8s.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS)
    entity = await start_budget(client, kube_worker, {"count": 1})
    holder = await start_maintenance(client, kube_worker, "b-01", uncordon_after=True,
                                     protected_pod_selector="workload=training")  # fmt: skip
    await wait_for(lambda: maintenance_phase(holder, "waiting-for-protected-pods"), what="b-01 held")
    since = await k8s.audit_cursor()
    policy = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}
    spec = rollout_spec("paused-wait", policy=policy, nodeSelectors={"matchLabels": {"pool": "a"}})
    rollout = await client.start_workflow(Rollout.run, spec, id=f"{spec.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                          task_queue=kube_worker.task_queue)  # fmt: skip

    # The batch asks for both nodes in one request, to hold them itself; both wait behind b-01.
    state = await state_where(entity, lambda s: len(s.queue) == 2, "the batch's two nodes queued")
    assert {lease.node for lease in state.queue} == {"a-01", "a-02"}
    assert {(lease.holder, lease.reply_to) for lease in state.queue} == {(state.queue[0].reply_to,) * 2}
    assert state.queue[0].reply_to.startswith(f"{rollout.id}/")  # the batch hears both decisions
    batch = client.get_workflow_handle(state.queue[0].reply_to)

    async def both_waiting():
        waiting = await batch.query(RolloutBatch.waiting_for_budget)
        return waiting if len(waiting) == 2 else None

    assert all("queued #" in note for note in (await wait_for(both_waiting, what="the batch's view")).values())

    await rollout.execute_update(Rollout.pause, ReasonRequest(reason="change freeze"))
    await state_where(entity, lambda s: not s.queue, "the paused batch's requests withdrawn")
    await holder.execute_update(NodeMaintenance.skip_wait, SkipWaitRequest(reason="test"))
    assert (await asyncio.wait_for(holder.result(), 60)).uncordoned
    await asyncio.sleep(1.5)  # several decision cycles: a paused rollout takes nothing
    state = await budget_state(entity)
    assert state.leases == [] and state.queue == []
    assert await node_writes(k8s, "a-01", since) == [] and await node_writes(k8s, "a-02", since) == []

    await rollout.execute_update(Rollout.resume, ReasonRequest(reason="freeze over"))
    result = await asyncio.wait_for(rollout.result(), 120)
    assert result.outcome == "completed" and result.counts == {"complete": 2}
    assert max_out_of_service(await k8s.audit()) == 1


def carried_queue(history) -> int:
    """How many waiting requests a run handed its successor (the book in its continue-as-new input)."""
    attrs = history.events[-1].workflow_execution_continued_as_new_event_attributes
    return len(json.loads(attrs.input.payloads[0].data)["book"]["queue"])


async def test_the_entity_continues_as_new_losing_no_request(small_history_env, k8s, kubeconfig_path):
    """Every run of the entity is suggested to continue as new after 20 events, while five holders keep
    requesting and releasing by signal: each gets its lease in turn, and no update is ever used."""
    await k8s.seed(small_fleet())
    client = small_history_env.client
    async with worker_on(client, kubeconfig_path) as worker:
        entity = await start_budget(client, worker, {"count": 1})
        holders = await asyncio.gather(*(start_maintenance(client, worker, f"node-{i:02d}", uncordon_after=True)
                                         for i in range(1, 6)))  # fmt: skip
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in holders)), 150)
        assert all(r.outcome == "completed" and r.uncordoned for r in results), results
        assert max_out_of_service(await k8s.audit()) == 1
        runs = await continued_runs(client, entity)
        waiting = [carried_queue(h) for h in runs[:-1]]  # the holders each continue-as-new handed on, waiting
        assert any(waiting), f"the entity continued as new while holders waited: {len(runs)} runs, carried {waiting}"
        counts = [history_counts(h) for h in runs]
        assert sum(c.get("workflow_execution_update_accepted_event_attributes", 0) for c in counts) == 0
        await state_where(client.get_workflow_handle(entity.id), lambda s: not s.leases and not s.queue,
                          "every lease returned")  # fmt: skip
        await client.get_workflow_handle(entity.id).terminate("test over")


async def test_the_entity_follows_its_requesters_to_another_task_queue(client, k8s, kubeconfig_path):
    await k8s.seed(small_fleet(protected_on="node-01"))
    async with worker_on(client, kubeconfig_path) as new:
        async with worker_on(client, kubeconfig_path) as old:
            entity = await start_budget(client, old, {"count": 1})
            holder = await start_maintenance(client, old, "node-01", uncordon_after=True,
                                             protected_pod_selector=PROTECTED)  # fmt: skip
            await wait_for(lambda: maintenance_phase(holder, "waiting-for-protected-pods"), what="node-01 held")
            # A request from the new queue: the entity continues as new there, with the lease it holds.
            waiter = await start_maintenance(client, new, "node-02", uncordon_after=True)

            async def moved():
                described = await client.get_workflow_handle(entity.id).describe()
                return described if described.task_queue == new.task_queue else None

            await wait_for(moved, what="the entity on the new task queue")
            latest = client.get_workflow_handle(entity.id)
            state = await state_where(latest, lambda s: s.queue, "node-02 waiting in the new run")
            assert [(lease.node, lease.holder) for lease in state.leases] == [("node-01", holder.id)]
            assert [lease.node for lease in state.queue] == ["node-02"]
            await record_history(client.get_workflow_handle(entity.id, run_id=entity.result_run_id),
                                 "disruption_budget_queue_move")  # fmt: skip
            await holder.execute_update(NodeMaintenance.skip_wait, SkipWaitRequest(reason="test"))
            assert (await asyncio.wait_for(holder.result(), 60)).uncordoned
        # The old queue has no worker any more: the entity and the waiter need only the new one.
        result = await asyncio.wait_for(waiter.result(), 60)
        assert result.outcome == "completed" and result.uncordoned
        assert max_out_of_service(await k8s.audit()) == 1
        await latest.terminate("test over")


async def test_an_idle_entity_closes_and_the_next_run_keeps_the_operators_budget(client, k8s, kubeconfig_path):
    await k8s.seed(small_fleet())
    async with worker_on(client, kubeconfig_path) as old:
        entity = await start_budget(client, old, {"count": 1}, idle_close_after=timedelta(seconds=1))
        await entity.execute_update(DisruptionBudget.set_budget,
                                    BudgetChange(budget=Budget(count=2), by="sre", reason="two at once"))  # fmt: skip
        closed = await asyncio.wait_for(entity.result(), 30)  # nothing held: it closes, handing its settings on
        assert closed.budget == Budget(count=2)
    # Every worker moved to another queue while the entity was closed: the next request starts it there.
    async with worker_on(client, kubeconfig_path) as new:
        handle = await start_maintenance(client, new, "node-02", uncordon_after=True)
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.outcome == "completed" and result.uncordoned
        latest = client.get_workflow_handle(budget_workflow_id("lab"))
        described = await latest.describe()
        assert described.run_id != entity.result_run_id and described.task_queue == new.task_queue
        assert described.status == WorkflowExecutionStatus.RUNNING
        state = await budget_state(latest)
        assert state.budget == Budget(count=2) and state.budget_source == "operator sre: two at once"
        await latest.terminate("test over")
