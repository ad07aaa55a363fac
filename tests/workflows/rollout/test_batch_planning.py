"""Batch planning (docs/rollout-batch-planning.md): erroring nodes retried in later batches, membership re-read
before each batch, the priority order, resetBatchStateOnCompletion. Pure rules first, then rollouts on a real dev
server against the Kubernetes emulator."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from activities.kube.models import ROLLOUT_STATE_LABEL
from tests.kube_helpers import read_node
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import max_unavailable, rollout_fleet, rollout_spec
from tests.workflows.rollout.test_rollout import lab_ready, start, status_where
from workflows.rollout.batching import NODE_PRIORITY_LABEL, NodeSnapshot, batch_order, plan
from workflows.rollout.membership import reconcile
from workflows.rollout.models import ApproveRequest, ReasonRequest
from workflows.rollout.rollout import Rollout
from workflows.rollout.state import BatchState, CompartmentState, RolloutCheckpoint

POLICY = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 1}}}}


# ---------------------------------------------------------------- the rules


def test_policy_settings_take_nodewright_names_and_defaults():
    spec = rollout_spec("names")
    assert spec.deployment_policy.retry_erroring_nodes == 1 and spec.resets_batch_state()
    spec = rollout_spec(
        "names",
        policy={**POLICY, "retryErroringNodes": 0, "resetBatchStateOnCompletion": False},
        deploymentPolicyOptions={"resetBatchStateOnCompletion": True},
    )
    assert spec.deployment_policy.retry_erroring_nodes == 0 and spec.resets_batch_state()  # the rollout's override
    for bad, path in (
        ({"retryErroringNodes": -1}, "deploymentPolicy.retryErroringNodes"),
        ({"retryErroringNodes": 11}, "deploymentPolicy.retryErroringNodes"),
        ({"resetBatchStateOnCompletion": "maybe"}, "deploymentPolicy.resetBatchStateOnCompletion"),
    ):
        with pytest.raises(ValidationError) as err:
            rollout_spec("bad", policy={**POLICY, **bad})
        assert path in str(err.value)
    with pytest.raises(ValidationError, match=r"deploymentPolicyOptions\.resetBatch"):
        rollout_spec("bad", deploymentPolicyOptions={"resetBatch": True})


def test_order_is_priority_then_retries_last_then_out_of_service_then_oldest_then_name():
    nodes = {
        "n1": NodeSnapshot(name="n1", created="2026-01-02T00:00:00Z"),
        "n2": NodeSnapshot(name="n2", created="2026-01-01T00:00:00Z"),
        "n3": NodeSnapshot(name="n3", labels={NODE_PRIORITY_LABEL: "10"}),
        "n4": NodeSnapshot(name="n4", labels={NODE_PRIORITY_LABEL: "not-a-number"}),
        "n5": NodeSnapshot(name="n5", labels={NODE_PRIORITY_LABEL: "1"}),
        "n6": NodeSnapshot(name="n6", created="2026-01-03T00:00:00Z"),
    }
    states = {"n1": "waiting", "n2": "waiting", "n3": "erroring", "n4": "waiting", "n5": "waiting", "n6": "blocked"}
    assert batch_order(nodes, nodes, states, unavailable={"n6"}) == ["n5", "n3", "n6", "n4", "n2", "n1"]
    # An erroring node waits behind every node of its priority that is no retry.
    assert batch_order(["n1", "n3"], {"n1": nodes["n1"]}, {"n3": "erroring"}, set()) == ["n1", "n3"]


def test_plan_batches_follow_the_priority_label_and_warns_of_a_bad_one():
    spec = rollout_spec("plan", policy=POLICY)
    nodes = [
        NodeSnapshot(name="a-01", labels={"gpu": "true"}),
        NodeSnapshot(name="a-02", labels={"gpu": "true", NODE_PRIORITY_LABEL: "3"}),
        NodeSnapshot(name="a-03", labels={"gpu": "true", NODE_PRIORITY_LABEL: "high"}),
    ]
    p = plan(nodes, spec)
    assert [b.nodes for b in p.compartments[0].batches] == [["a-02"], ["a-01"], ["a-03"]]
    assert p.warnings == [f"node a-03: label {NODE_PRIORITY_LABEL}='high' is not a positive integer; it counts as 200"]


def test_reconcile_joins_leaves_and_never_takes_a_running_node():
    spec = rollout_spec(
        "members",
        policy={
            **POLICY,
            "compartments": [
                {"name": "canary", "selector": {"matchLabels": {"canary": "true"}}, "budget": {"count": 1}}
            ],
        },
    )
    cp = RolloutCheckpoint(
        compartments={
            "__default__": CompartmentState(
                members=["a", "b", "c", "d"], batch=BatchState(completed_nodes=1, failed_nodes=1)
            )
        },
        nodes={"a": "complete", "b": "erroring", "c": "in_progress", "d": "waiting"},
        reasons={"b": "dkms build failed"},
        retries={"b": 1},
    )
    live = [NodeSnapshot(name="d", labels={"canary": "true"}), NodeSnapshot(name="e")]
    change = reconcile(cp, live, spec.deployment_policy)
    assert change.joined == {"e": "__default__"} and change.moved == {"d": "canary"}
    assert change.left == {"a": "complete", "b": "erroring"}  # c runs: it stays until its batch is over
    assert cp.compartments["__default__"].members == ["c", "e"] and cp.compartments["canary"].members == ["d"]
    assert (
        cp.compartments["__default__"].batch.completed_nodes == 0
        and cp.compartments["__default__"].batch.failed_nodes == 0
    )
    assert "a" not in cp.nodes and "b" not in cp.reasons and "b" not in cp.retries and cp.nodes["e"] == "waiting"
    assert cp.joined == {"e": "__default__"} and cp.left == {"a": "complete", "b": "erroring"}
    # A node that comes back joins again; one that finished running leaves at the next re-read.
    cp.nodes["c"] = "complete"
    cp.compartments["__default__"].batch = BatchState(completed_nodes=1)
    change = reconcile(
        cp,
        [NodeSnapshot(name="a"), NodeSnapshot(name="e"), NodeSnapshot(name="d", labels={"canary": "true"})],
        spec.deployment_policy,
    )
    assert change.joined == {"a": "__default__"} and change.left == {"c": "complete"} and not change.moved
    assert "a" not in cp.left and cp.compartments["__default__"].batch.completed_nodes == 0


# ---------------------------------------------------------------- rollouts


async def test_an_erroring_node_is_retried_and_completes_in_a_later_batch(client, kube_worker, k8s, core):
    rules = [{"node": "a-01", "stage": "apply", "outcome": "fail", "times": 1, "message": "dkms build failed"}]
    await lab_ready(k8s, rollout_fleet({"a": 3}), rules)
    handle = await start(client, kube_worker, rollout_spec("retry", policy=POLICY))
    result = await handle.result()

    assert result.outcome == "completed" and result.counts == {"complete": 3} and result.problems == {}
    status = await handle.query(Rollout.status)
    # a-01 failed in batch 1 and stayed cordoned (1 of the budget's 2): one node at a time until its retry, last.
    assert [b.order for b in status.recent_batches] == [["a-01"], ["a-02"], ["a-03"], ["a-01"]]
    assert [b.retried for b in status.recent_batches] == [[], [], [], ["a-01"]]
    assert [b.success_percent for b in status.recent_batches] == [0, 100, 100, 100]
    assert (
        status.compartments["__default__"].batch_state.model_dump()
        == BatchState(current_batch=5, completed_nodes=3, failed_nodes=0, last_batch_size=1).model_dump()
    )
    assert max_unavailable(await k8s.audit(), {"a-01", "a-02", "a-03"}) <= 2
    node = await read_node(core, "a-01")
    assert not node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    await record_history(handle, "rollout_planning_retry")
    # The shape after the fleet engine: batches take a NodeWork and return their children's results as JSON.
    await record_history(handle, "rollout_fleet_engine")
    async for batch in client.list_workflows(f"WorkflowId STARTS_WITH '{handle.id}/__default__/batch'"):
        await record_history(client.get_workflow_handle(batch.id, run_id=batch.run_id), "rollout_batch_work")
        break


async def test_retries_are_bounded_and_count_against_the_stop_rule(client, kube_worker, k8s, core):
    # a-01 fails every time: one retry (retryErroringNodes 1), and the retry's failure is a failed batch.
    await lab_ready(k8s, rollout_fleet({"a": 2}), [{"node": "a-01", "stage": "apply", "outcome": "fail"}])
    policy = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 2}}}}
    handle = await start(client, kube_worker, rollout_spec("retry-bound", policy=policy))
    result = await handle.result()
    assert result.outcome == "completed" and result.counts == {"complete": 1, "erroring": 1}
    state = result.compartments["__default__"]
    # batch 1 a-01 failed, batch 2 a-02 passed (resets the run of failures), batch 3 the retry failed.
    assert (state.completed_nodes, state.failed_nodes, state.consecutive_failures) == (1, 1, 1)
    status = await handle.query(Rollout.status)
    assert status.problems["a-01"].retries == 1 and "apply" in status.problems["a-01"].reason
    assert [b.order for b in status.recent_batches] == [["a-01"], ["a-02"], ["a-01"]]


async def approve_until_done(handle):
    """Approve every batch that waits for approval until the rollout ends."""

    def waiting(s):
        return {
            (name, c.batch_state.current_batch)
            for name, c in s.compartments.items()
            if c.phase == "waiting-for-approval"
        }

    while True:
        status = await status_where(
            handle, lambda s: s.phase in ("completed", "aborted") or waiting(s), "an approval or the end"
        )
        if status.phase in ("completed", "aborted"):
            return await handle.result()
        await handle.execute_update(Rollout.approve_batch, ApproveRequest(approver="sre"))
        approved = waiting(status)
        await status_where(
            handle, lambda s: s.phase in ("completed", "aborted") or waiting(s) != approved, "the approval taken"
        )


async def test_a_node_labelled_mid_rollout_joins_and_an_unlabelled_one_leaves(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 3}))
    await core.patch_node("a-03", {"metadata": {"labels": {"gpu": None}}})
    handle = await start(client, kube_worker, rollout_spec("members", policy=POLICY, approval="batch"))
    status = await status_where(
        handle,
        lambda s: (
            s.compartments.get("__default__") is not None
            and s.compartments["__default__"].phase == "waiting-for-approval"
        ),
        "the first approval",
    )
    assert status.counts == {"waiting": 2}

    await core.patch_node("a-03", {"metadata": {"labels": {"gpu": "true"}}})  # starts matching
    await core.patch_node("a-02", {"metadata": {"labels": {"gpu": None}}})  # stops matching
    result = await approve_until_done(handle)

    assert result.outcome == "completed" and result.counts == {"complete": 2}
    status = await handle.query(Rollout.status)
    assert status.joined == {"a-03": "__default__"} and status.left == {"a-02": "waiting"}
    first = status.recent_batches[0]
    assert first.joined == ["a-03"] and first.left == ["a-02"]
    assert sorted(n for b in status.recent_batches for n in b.order) == ["a-01", "a-03"]
    assert ROLLOUT_STATE_LABEL not in ((await read_node(core, "a-02")).metadata.labels or {})
    assert (await read_node(core, "a-03")).metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    assert "1 nodes joined, 1 left" in (await handle.query(Rollout.progress)).details
    await record_history(handle, "rollout_planning_membership")


async def test_batches_take_nodes_in_priority_order(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 4}))
    await core.patch_node("a-04", {"metadata": {"labels": {NODE_PRIORITY_LABEL: "1"}}})
    await core.patch_node("a-03", {"metadata": {"labels": {NODE_PRIORITY_LABEL: "50"}}})
    policy = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}
    handle = await start(client, kube_worker, rollout_spec("priority", policy=policy))
    result = await handle.result()
    assert result.outcome == "completed" and result.counts == {"complete": 4}
    status = await handle.query(Rollout.status)
    assert [b.order for b in status.recent_batches] == [["a-04", "a-03"], ["a-01", "a-02"]]


@pytest.mark.parametrize("reset", [True, False])
async def test_a_version_change_resets_the_batch_state_unless_kept(client, kube_worker, k8s, core, reset):
    await lab_ready(k8s, rollout_fleet({"a": 2}))
    stopped = BatchState(current_batch=3, consecutive_failures=2, should_stop=True)
    checkpoint = RolloutCheckpoint(
        compartments={"__default__": CompartmentState(members=["a-01", "a-02"], batch=stopped)},
        nodes={"a-01": "waiting", "a-02": "waiting"},
        package_versions={"kernel-tuning": "1.1.0"},
    )
    spec = rollout_spec(
        "versions",
        policy=POLICY,
        checkpoint=checkpoint.model_dump(by_alias=True),
        deploymentPolicyOptions={"resetBatchStateOnCompletion": reset},
    )
    handle = await start(client, kube_worker, spec)
    if reset:
        result = await handle.result()
        assert result.outcome == "completed" and result.counts == {"complete": 2}
        assert result.compartments["__default__"].current_batch == 3  # two batches from batch 1
    else:
        status = await status_where(handle, lambda s: s.phase == "stopped", "the kept stop")
        assert status.compartments["__default__"].batch_state.current_batch == 3
        await handle.execute_update(Rollout.abort, ReasonRequest(reason="kept state stops it"))
        assert (await handle.result()).counts == {"waiting": 2}


@pytest.mark.parametrize("reset", [True, False])
async def test_nodes_joining_a_completed_compartment_start_from_batch_one_unless_kept(
    client, kube_worker, k8s, core, reset
):
    await lab_ready(k8s, rollout_fleet({"a": 4}))
    await core.patch_node("a-01", {"metadata": {"labels": {"canary": "true"}}})
    await core.patch_node("a-04", {"metadata": {"labels": {"gpu": None}}})
    policy = {
        **POLICY,
        "resetBatchStateOnCompletion": reset,
        "compartments": [
            {
                "name": "canary",
                "selector": {"matchLabels": {"canary": "true"}},
                "budget": {"count": 1},
                "strategy": {"linear": {"initialBatch": 1, "delta": 1}},
            }
        ],
    }
    handle = await start(client, kube_worker, rollout_spec("completion", policy=policy, approval="batch"))

    def phases(s):
        return {name: c.phase for name, c in s.compartments.items()}

    await status_where(
        handle,
        lambda s: phases(s) == {"canary": "waiting-for-approval", "__default__": "waiting-for-approval"},
        "both approvals",
    )
    await handle.execute_update(Rollout.approve_batch, ApproveRequest(approver="sre"))
    status = await status_where(
        handle, lambda s: phases(s) == {"canary": "done", "__default__": "waiting-for-approval"}, "the canary done"
    )
    assert status.compartments["canary"].batch_state.current_batch == 2
    # A new canary node: it joins the finished compartment at the default compartment's next re-read.
    await core.patch_node("a-04", {"metadata": {"labels": {"gpu": "true", "canary": "true"}}})
    result = await approve_until_done(handle)

    assert result.outcome == "completed" and result.counts == {"complete": 4}
    status = await handle.query(Rollout.status)
    assert status.joined == {"a-04": "canary"}
    canary = [b for b in status.recent_batches if b.compartment == "canary"]
    assert [b.order for b in canary] == [["a-01"], ["a-04"]]
    # Reset: batch 1 again (linear's initialBatch); kept: batch 2 of the progression (1 + delta, clamped to 1 left).
    assert [b.number for b in canary] == ([1, 1] if reset else [1, 2])
    assert [b.strategy_size for b in canary] == [1, 1]


async def test_a_running_node_that_stops_matching_finishes_then_leaves(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 2}), [{"node": "a-01", "stage": "apply", "seconds": 3.0}])
    handle = await start(client, kube_worker, rollout_spec("leave-running", policy=POLICY))
    await status_where(handle, lambda s: s.counts.get("in_progress") == 1, "a-01 running")
    await core.patch_node("a-01", {"metadata": {"labels": {"gpu": None}}})
    result = await handle.result()

    assert result.outcome == "completed" and result.counts == {"complete": 1}
    # a-01 finished its packages, then left at the next re-read; the compartment's counters dropped it.
    status = await handle.query(Rollout.status)
    assert status.left == {"a-01": "complete"} and status.recent_batches[1].left == ["a-01"]
    assert result.compartments["__default__"].completed_nodes == 1
    node = await read_node(core, "a-01")
    assert not node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
