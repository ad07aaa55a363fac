"""One disruption budget per cluster, on a real dev server against the Kubernetes emulator.

Whether the budget held is judged from the emulator's audit log (every node write carries the node as the
write left it), not from the entity's own account.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Set
from datetime import timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError

from lab.fleet import Fleet
from tests.kube_helpers import read_node, single_pod_workload, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import (
    JOBS_FAST,
    REBOOT_SECONDS,
    availability_timeline,
    rollout_fleet,
    rollout_spec,
)
from workflows.budget.budget import Budget
from workflows.budget.disruption_budget import (
    BudgetChange,
    BudgetView,
    DisruptionBudget,
    DisruptionBudgetInput,
    Lease,
    LeaseRelease,
    LeaseRequest,
)
from workflows.maintenance.node_maintenance import NodeMaintenance, NodeMaintenanceInput
from workflows.rollout.rollout import Rollout


def small_fleet(*, not_ready: tuple[str, ...] = (), protected_on: str | None = None) -> list[dict]:
    """node-01..05, a web pod on each of 01..04 (evicted by drains), a DaemonSet; optionally NotReady nodes
    and a protected pod that never finishes."""
    nodes = [{"name": f"node-{i:02d}", "ready": f"node-{i:02d}" not in not_ready} for i in range(1, 6)]
    workloads = [
        {"name": "web", "namespace": "apps", "replicas": 4, "labels": {"app": "web"},
         "nodes": [f"node-{i:02d}" for i in range(1, 5)], "terminationGracePeriodSeconds": 5},
        {"name": "dcgm-exporter", "kind": "DaemonSet", "namespace": "gpu-operator", "labels": {"app": "dcgm"}},
    ]  # fmt: skip
    if protected_on:
        workloads.append(single_pod_workload("protected", protected_on, {"millwright.dev/protected": "true"}, None))
    return Fleet.model_validate({"cluster": "lab", "nodes": nodes, "workloads": workloads}).to_objects()


async def start_budget(client, worker, budget: dict, cluster: str = "lab", **fields):
    """The cluster's entity, started by the test with short intervals (requesters attach to it)."""
    inp = DisruptionBudgetInput(cluster=cluster, budget=Budget(**budget), check_interval=timedelta(seconds=0.5),
                                liveness_interval=timedelta(seconds=1), task_queue=worker.task_queue,
                                **fields)  # fmt: skip
    return await client.start_workflow(DisruptionBudget.run, inp, id=inp.workflow_id(), task_queue=worker.task_queue)


async def start_maintenance(client, worker, node: str, **fields):
    fields.setdefault("drain", {"eviction_retry_interval": 0.5, "timeout": 60})
    inp = NodeMaintenanceInput(cluster="lab", node=node, reason="budget test", **fields)
    return await client.start_workflow(
        NodeMaintenance.run, inp, id=f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}", task_queue=worker.task_queue
    )


async def budget_state(entity) -> BudgetView:
    return await entity.query(DisruptionBudget.state)


async def state_where(entity, predicate, what: str, timeout: float = 30) -> BudgetView:
    async def probe():
        state = await budget_state(entity)
        return state if predicate(state) else None

    return await wait_for(probe, what=what, timeout=timeout)


async def maintenance_phase(handle, phase: str):
    status = await handle.query(NodeMaintenance.status)
    return status if status.phase == phase else None


async def results_watching_the_queue(entity, handles, timeout: float) -> tuple[list, int]:
    """The runs' results, and the longest the entity's queue was meanwhile (sampled)."""
    longest = 0

    async def sample():
        nonlocal longest
        while True:
            longest = max(longest, len((await budget_state(entity)).queue))
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample())
    try:
        return await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), timeout), longest
    finally:
        sampler.cancel()


def cordon_spans(audit: list[dict]) -> dict[str, list[tuple[int, int | None]]]:
    """Per node, the audit sequence numbers at which it went out of service and came back."""
    spans: dict[str, list[tuple[int, int | None]]] = {}
    down: dict[str, bool] = {}
    for seq, state in availability_timeline(audit):
        for node, unavailable in state.items():
            if unavailable and not down.get(node):
                spans.setdefault(node, []).append((seq, None))
            elif not unavailable and down.get(node):
                spans[node][-1] = (spans[node][-1][0], seq)
            down[node] = unavailable
    return spans


def max_out_of_service(audit: list[dict], already: Set[str] = frozenset()) -> int:
    """The most nodes out of service at once after any node write, counting `already` (NotReady nodes the
    seed made, never written) until a write says otherwise."""
    worst = 0
    for _, state in availability_timeline(audit):
        down = {n for n, d in state.items() if d} | {n for n in already if n not in state}
        worst = max(worst, len(down))
    return worst


async def test_two_holders_racing_for_a_budget_of_one_are_serialized(client, kube_worker, k8s, core):
    await k8s.seed(small_fleet())
    entity = await start_budget(client, kube_worker, {"count": 1})
    first, second = await asyncio.gather(
        start_maintenance(client, kube_worker, "node-02", uncordon_after=True),
        start_maintenance(client, kube_worker, "node-03", uncordon_after=True),
    )
    results = await asyncio.wait_for(asyncio.gather(first.result(), second.result()), 90)

    assert all(r.outcome == "completed" and r.uncordoned for r in results), results
    audit = await k8s.audit()
    assert max_out_of_service(audit) == 1
    spans = cordon_spans(audit)
    ((a_down, a_up),) = spans["node-02"]
    ((b_down, b_up),) = spans["node-03"]
    assert a_up is not None and b_up is not None
    assert a_up < b_down or b_up < a_down, f"out of service at once: {spans}"
    state = await budget_state(entity)
    assert state.leases == [] and state.queue == []


async def test_a_node_not_ready_for_other_reasons_consumes_the_budget(client, kube_worker, k8s, core):
    await k8s.seed(small_fleet(not_ready=("node-04",)))
    entity = await start_budget(client, kube_worker, {"count": 1})
    since = await k8s.audit_cursor()
    handle = await start_maintenance(client, kube_worker, "node-02", uncordon_after=True)
    status = await wait_for(lambda: maintenance_phase(handle, "waiting-for-budget"), what="the maintenance waiting")
    assert "queued #1" in status.note
    state = await state_where(entity, lambda s: s.queue, "the request queued")
    assert state.out_of_service == {"node-04": "NotReady"} and state.allowed == 1 and state.total_nodes == 5
    assert state.queue[0].node == "node-02" and "1 of 1 allowed" in state.queue[0].note

    # The NotReady node itself costs nothing more: granted at once, budget full or not.
    holder = entity.id  # any running workflow will do as a holder here
    lease = await entity.execute_update(DisruptionBudget.acquire, LeaseRequest(node="node-04", holder=holder))
    assert lease.state == "granted" and lease.note == "the node was already out of service"
    await entity.execute_update(DisruptionBudget.release, LeaseRelease(node="node-04", holder=holder))

    await asyncio.sleep(1.5)  # several decisions: still waiting, and nothing written to node-02
    assert (await handle.query(NodeMaintenance.status)).phase == "waiting-for-budget"
    assert not [e for e in await k8s.audit(since=since, writes=True) if e.get("name") == "node-02"]

    # The operator makes room: the request is decided at once.
    await entity.execute_update(
        DisruptionBudget.set_budget, BudgetChange(budget=Budget(count=2), by="sre", reason="ok")
    )
    result = await asyncio.wait_for(handle.result(), 60)
    assert result.outcome == "completed" and result.uncordoned
    assert max_out_of_service(await k8s.audit(since=since), already={"node-04"}) <= 2
    state = await budget_state(entity)
    assert state.budget_source == "operator sre: ok" and state.leases == []


async def test_only_the_operator_sets_the_clusters_budget_whatever_its_requesters_state(client, kube_worker, k8s):
    from starter.controls import budget_set

    await k8s.seed(small_fleet(protected_on="node-01"))
    inp = DisruptionBudgetInput(cluster="lab", check_interval=timedelta(seconds=0.5),
                                liveness_interval=timedelta(seconds=1), task_queue=kube_worker.task_queue)  # fmt: skip
    entity = await client.start_workflow(DisruptionBudget.run, inp, id=inp.workflow_id(),
                                         task_queue=kube_worker.task_queue)  # fmt: skip
    first = await start_maintenance(client, kube_worker, "node-01", disruption_budget=Budget(count=3),
                                    protected_pod_selector="millwright.dev/protected=true")  # fmt: skip
    await wait_for(lambda: maintenance_phase(first, "waiting-for-protected-pods"), what="node-01 held")
    second = await start_maintenance(client, kube_worker, "node-02", uncordon_after=True,
                                     disruption_budget=Budget(count=2))  # fmt: skip
    await wait_for(lambda: maintenance_phase(second, "waiting-for-budget"), what="node-02 waiting")
    # Neither the first requester's budget (3) nor the second's (2) is the cluster's: 10% of 5 nodes is 1.
    state = await state_where(entity, lambda s: s.queue, "node-02 queued")
    assert (state.budget, state.budget_source, state.allowed) == (Budget(percent=10), "default", 1)
    assert "1 of 1 allowed" in state.queue[0].note
    assert state.own_budgets == {first.id: "its own budget 3 nodes = 3: 1 leased, 0 waiting",
                                 second.id: "its own budget 2 nodes = 2: 0 leased, 1 waiting"}  # fmt: skip

    outcome = await budget_set(client, "lab", count=2, by="sre", reason="two at once")  # `millwright budget set`
    assert outcome.state.budget == Budget(count=2)
    result = await asyncio.wait_for(second.result(), 60)
    assert result.outcome == "completed" and result.uncordoned
    assert max_out_of_service(await k8s.audit()) == 2
    state = await budget_state(entity)
    assert (state.budget, state.budget_source) == (Budget(count=2), "operator sre: two at once")
    await first.terminate("test over")
    await record_history(entity, "disruption_budget_operator_budget")


async def test_the_operator_declares_the_budget_before_any_requester_asks(client, kube_worker, k8s):
    from starter.controls import budget_set

    await k8s.seed(small_fleet())
    outcome = await budget_set(client, "lab", percent=40, by="sre", reason="weekend",
                               task_queue=kube_worker.task_queue)  # fmt: skip
    # No entity ran: `budget set` started one to hold it, as the operator's (who and why), not as its input.
    assert (outcome.state.budget, outcome.state.budget_source) == (Budget(percent=40), "operator sre: weekend")
    state = await budget_state(client.get_workflow_handle("disruption-budget/lab"))
    assert (state.budget, state.budget_source) == (Budget(percent=40), "operator sre: weekend")


async def test_a_lease_held_by_a_terminated_run_is_recovered(client, kube_worker, k8s, core):
    await k8s.seed(small_fleet(protected_on="node-01"))
    entity = await start_budget(client, kube_worker, {"count": 1})
    holder = await start_maintenance(
        client, kube_worker, "node-01", protected_pod_selector="millwright.dev/protected=true"
    )
    await wait_for(lambda: maintenance_phase(holder, "waiting-for-protected-pods"), what="node-01 held")
    waiter = await start_maintenance(client, kube_worker, "node-02", uncordon_after=True)
    await wait_for(lambda: maintenance_phase(waiter, "waiting-for-budget"), what="node-02 waiting")
    state = await budget_state(entity)
    assert [(lease.node, lease.holder) for lease in state.leases] == [("node-01", holder.id)]

    await holder.terminate("the holder dies")
    # The lease is recovered; node-01 stays cordoned, so it still counts and node-02 still waits.
    state = await state_where(entity, lambda s: not s.leases, "the lease recovered")
    assert state.out_of_service.get("node-01") == "cordoned", state.out_of_service
    assert [lease.node for lease in state.queue] == ["node-02"]
    assert (await read_node(core, "node-02")).spec.unschedulable is not True

    await core.patch_node("node-01", {"spec": {"unschedulable": False}})  # an operator takes node-01 back
    result = await asyncio.wait_for(waiter.result(), 60)
    assert result.outcome == "completed" and result.uncordoned
    assert max_out_of_service(await k8s.audit()) == 1
    await record_history(entity, "disruption_budget_signal_recovery")
    await record_history(waiter, "node_maintenance_lease_decided_early")


async def test_acquire_is_idempotent_and_first_come_first_served(client, kube_worker, k8s):
    await k8s.seed(small_fleet())
    entity = await start_budget(client, kube_worker, {"count": 1})
    # Running workflows to stand for holders: other clusters' entities (their liveness is what counts).
    holders = [await start_budget(client, kube_worker, {"count": 1}, cluster=f"holder-{i}") for i in (1, 2, 3)]
    h1, h2, h3 = (h.id for h in holders)

    async def acquire(node: str, holder: str) -> Lease:
        return await entity.execute_update(DisruptionBudget.acquire, LeaseRequest(node=node, holder=holder, reason="t"))

    first = await acquire("node-01", h1)
    again = await acquire("node-01", h1)
    assert first.state == again.state == "granted" and first.id == again.id
    queued2 = await acquire("node-02", h2)
    queued3 = await acquire("node-03", h3)
    assert (queued2.state, queued2.position, queued3.position) == ("queued", 1, 2)
    assert (await acquire("node-02", h2)).id == queued2.id  # a retried acquire while queued: the same request
    assert len(await entity.query(DisruptionBudget.leases)) == 3

    await entity.execute_update(DisruptionBudget.release, LeaseRelease(node="node-01", holder=h1))
    state = await state_where(entity, lambda s: s.leases and s.leases[0].holder == h2, "the next in line granted")
    assert [q.id for q in state.queue] == [queued3.id] and state.queue[0].position == 1
    granted = await acquire("node-02", h2)
    assert granted.id == queued2.id and granted.state == "granted"
    released = await entity.execute_update(DisruptionBudget.release, LeaseRelease(node="node-02", holder=h2))
    assert released.released and not (await entity.execute_update(
        DisruptionBudget.release, LeaseRelease(node="node-02", holder=h2))).released  # fmt: skip


async def test_operator_budget_update_is_validated(client, kube_worker, k8s):
    await k8s.seed(small_fleet())
    entity = await start_budget(client, kube_worker, {"count": 1})
    await entity.execute_update(DisruptionBudget.acquire, LeaseRequest(node="node-01", holder=entity.id))  # a read

    with pytest.raises(WorkflowUpdateFailedError) as rejected:
        await entity.execute_update(DisruptionBudget.set_budget,
                                    BudgetChange(budget=Budget(count=9), by="sre", reason="more"))  # fmt: skip
    assert "count 9 is more than the 5 nodes of lab" in str(rejected.value.cause)
    for bad in ({"budget": {"percent": 0}, "by": "sre", "reason": "x"}, {"budget": {"count": 1, "percent": 5},
                "by": "sre", "reason": "x"}, {"budget": {"count": 1}, "by": "sre", "reason": ""}):  # fmt: skip
        with pytest.raises(WorkflowUpdateFailedError):
            await entity.execute_update("set_budget", bad)
    view = await entity.execute_update(DisruptionBudget.set_budget,
                                       BudgetChange(budget=Budget(percent=40), by="sre", reason="weekend"))  # fmt: skip
    assert view.budget == Budget(percent=40) and view.allowed == 2 and view.budget_source == "operator sre: weekend"
    # Rejected updates leave no trace in the history.
    history = await entity.fetch_history()
    accepted = [e for e in history.events if e.HasField("workflow_execution_update_accepted_event_attributes")]
    assert len(accepted) == 2


async def test_a_rollout_and_a_maintenance_together_never_exceed_the_budget(client, kube_worker, k8s, core):
    await k8s.seed(rollout_fleet({"a": 4, "b": 2}, protected_on="b-01", protected_finish_after=6))
    await k8s.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS)
    entity = await start_budget(client, kube_worker, {"count": 2})

    maintenance = await start_maintenance(client, kube_worker, "b-01", uncordon_after=True,
                                          protected_pod_selector="workload=training",
                                          protected_pods_poll_interval=0.5)  # fmt: skip
    await wait_for(lambda: maintenance_phase(maintenance, "waiting-for-protected-pods"), what="b-01 held")
    policy = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}
    spec = rollout_spec("shared-budget", policy=policy, nodeSelectors={"matchLabels": {"pool": "a"}})
    rollout = await client.start_workflow(Rollout.run, spec, id=f"{spec.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                          task_queue=kube_worker.task_queue)  # fmt: skip

    done, longest_queue = await results_watching_the_queue(entity, [maintenance, rollout], 120)
    assert done[0].outcome == "completed" and done[0].uncordoned
    assert done[1].outcome == "completed" and done[1].counts == {"complete": 4}
    assert longest_queue >= 1, "a node of the rollout waited for the maintenance's lease"
    assert max_out_of_service(await k8s.audit()) == 2
    state = await budget_state(entity)
    assert state.leases == [] and state.budget == Budget(count=2) and state.budget_source == "input"
    async for batch in client.list_workflows(
        f"WorkflowType = 'RolloutBatch' AND WorkflowId STARTS_WITH '{rollout.id}/'"
    ):
        await record_history(client.get_workflow_handle(batch.id, run_id=batch.run_id), "rollout_batch_leases")
        break


async def test_the_entity_continues_as_new_with_its_leases_and_queue(small_history_env, k8s, kubeconfig_path):
    from worker import registry
    from worker.config import WorkerSettings

    await k8s.seed(small_fleet())
    client = small_history_env.client
    registration = registry.build(WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0))
    async with registry.new_worker(client, registration, f"budget-can-{uuid.uuid4().hex[:8]}") as worker:
        entity = await start_budget(client, worker, {"count": 1})
        h1, h2 = [(await start_budget(client, worker, {"count": 1}, cluster=f"holder-{i}")).id for i in (1, 2)]
        granted = await entity.execute_update(DisruptionBudget.acquire, LeaseRequest(node="node-01", holder=h1))
        queued = await entity.execute_update(DisruptionBudget.acquire, LeaseRequest(node="node-02", holder=h2))
        assert (granted.state, queued.state) == ("granted", "queued")
        first_run = (await entity.describe()).run_id

        async def continued():
            described = await client.get_workflow_handle(entity.id).describe()
            return described.run_id != first_run

        await wait_for(continued, what="the entity continuing as new", timeout=60)
        latest = client.get_workflow_handle(entity.id)
        assert [(lease.id, lease.state) for lease in await latest.query(DisruptionBudget.leases)] == [
            (granted.id, "granted"),
            (queued.id, "queued"),
        ]
        # A retried acquire in the new run finds the same lease; a release lets the next one in.
        assert (
            await latest.execute_update(DisruptionBudget.acquire, LeaseRequest(node="node-01", holder=h1))
        ).id == granted.id
        await latest.execute_update(DisruptionBudget.release, LeaseRelease(node="node-01", holder=h1))
        state = await state_where(
            latest, lambda s: s.leases and s.leases[0].id == queued.id, "the queued lease granted"
        )
        assert state.queue == [] and state.budget == Budget(count=1)
        for workflow_id in (entity.id, h1, h2):
            await client.get_workflow_handle(workflow_id).terminate("test over")
    await registration.close()
