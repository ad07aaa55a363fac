"""Rollouts on a real dev server against the Kubernetes emulator.

Safety properties are judged from the emulator's audit log, not from the workflow's
own counters.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import pytest
from kubernetes.aio.client import PolicyV1Api
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError, RetryState

from activities.kube.models import PACKAGES_ANNOTATION, ROLLOUT_ANNOTATION, ROLLOUT_STATE_LABEL
from tests.kube_helpers import declare_lab_budget, read_node, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import (
    JOBS_FAST,
    REBOOT_SECONDS,
    batch_handle,
    max_unavailable,
    node_result,
    node_status,
    rollout_fleet,
    rollout_spec,
)
from workflows.rollout.models import ApproveRequest, ReasonRequest
from workflows.rollout.rollout import Rollout
from workflows.rollout.spec.spec import RolloutInput


async def start(client, worker, spec):
    await declare_lab_budget(client, worker.task_queue)
    return await client.start_workflow(
        Rollout.run, spec, id=f"{spec.workflow_id()}-{uuid.uuid4().hex[:6]}", task_queue=worker.task_queue
    )


async def lab_ready(k8s, objects, rules=()):
    await k8s.seed(objects)
    await k8s.configure(jobs={**JOBS_FAST, "rules": list(rules)}, rebootSeconds=REBOOT_SECONDS)


async def status_where(handle, predicate, what, timeout=60):
    async def probe():
        status = await handle.query(Rollout.status)
        return status if predicate(status) else None

    return await wait_for(probe, what=what, timeout=timeout)


async def test_budget_caps_every_batch_counting_nodes_already_out_of_service(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 8}))
    # Someone else's cordon: one node of the compartment is already out of service.
    await core.patch_node("a-08", {"spec": {"unschedulable": True}})
    policy = {"default": {"budget": {"count": 3}, "strategy": {"exponential": {"initialBatch": 1, "growthFactor": 2}}}}
    handle = await start(client, kube_worker, rollout_spec("budget", policy=policy))
    result = await handle.result()

    assert result.outcome == "completed" and result.counts == {"complete": 8}
    audit = await k8s.audit()
    members = {f"a-{i:02d}" for i in range(1, 9)}
    assert max_unavailable(audit, members) <= 3
    # The exponential strategy asked for 1, 2, 4, ... ; the cap (3 minus the foreign cordon) admitted at most 2.
    status = await handle.query(Rollout.status)
    assert all(b.strategy_size >= len(b.nodes) + b.completed for b in status.recent_batches)
    assert max(b.completed + len(b.nodes) for b in status.recent_batches) <= 2
    # The foreign cordon stays; every other node is back in service with the package recorded.
    for name in sorted(members):
        node = await read_node(core, name)
        assert node.spec.unschedulable == (name == "a-08"), name
        assert json.loads(node.metadata.annotations[PACKAGES_ANNOTATION]) == {"kernel-tuning": "1.2.0"}
        assert node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    await record_history(handle, "rollout_budget")
    async for batch in client.list_workflows(f"WorkflowId STARTS_WITH '{handle.id}/__default__/batch'"):
        await record_history(client.get_workflow_handle(batch.id, run_id=batch.run_id), "rollout_batch")
        break


async def test_stop_rule_halts_the_compartment_and_failed_nodes_stay_cordoned(client, kube_worker, k8s, core):
    rules = [
        {"node": "a-01", "stage": "apply", "outcome": "fail", "message": "dkms build failed"},
        {"node": "a-03", "stage": "apply", "outcome": "fail", "message": "dkms build failed"},
    ]
    await lab_ready(k8s, rollout_fleet({"a": 8}), rules)
    policy = {
        "default": {
            # Failed nodes stay cordoned and count against the budget: 4 leaves room for batch 2.
            "budget": {"count": 4},
            # safetyLimit defaults to 100: the failure threshold keeps working past halfway.
            "strategy": {"fixed": {"initialBatch": 2, "batchThreshold": 100, "failureThreshold": 2}},
        }
    }
    handle = await start(client, kube_worker, rollout_spec("stop", policy=policy))
    status = await status_where(handle, lambda s: s.phase == "stopped", "the stop rule")
    compartment = status.compartments["__default__"]
    assert compartment.batch_state.should_stop and compartment.batch_state.consecutive_failures == 2
    assert status.counts == {"erroring": 2, "complete": 2, "waiting": 4}
    assert "dkms build failed" in status.problems["a-01"].reason
    for name in ("a-01", "a-03"):
        node = await read_node(core, name)
        assert node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "erroring"
        assert "dkms build failed" in json.loads(node.metadata.annotations[ROLLOUT_ANNOTATION])["reason"]
    for name in ("a-05", "a-06", "a-07", "a-08"):
        assert ROLLOUT_STATE_LABEL not in ((await read_node(core, name)).metadata.labels or {})

    await handle.execute_update(Rollout.abort, ReasonRequest(reason="bad driver build"))
    result = await handle.result()
    assert result.outcome == "aborted" and result.counts["waiting"] == 4


async def test_approval_pause_resume_and_abort(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 6}))
    policy = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}
    handle = await start(client, kube_worker, rollout_spec("controls", policy=policy, approval="batch"))
    await status_where(
        handle,
        lambda s: s.compartments.get("__default__") and s.compartments["__default__"].phase == "waiting-for-approval",
        "approval",
    )
    assert (await handle.query(Rollout.status)).counts == {"waiting": 6}
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(Rollout.resume, ReasonRequest(reason="not paused"))
    await handle.execute_update(Rollout.approve_batch, ApproveRequest(approver="sre-on-call"))
    await status_where(handle, lambda s: s.counts.get("complete") == 2, "the first batch")

    # Pause while waiting for the next approval, then resume, then abort before batch 2 is approved.
    await handle.execute_update(Rollout.pause, ReasonRequest(reason="incident in progress"))
    status = await status_where(handle, lambda s: s.compartments["__default__"].phase == "paused", "the pause")
    assert status.paused_reason == "incident in progress"
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(Rollout.pause, ReasonRequest(reason="twice"))
    await handle.execute_update(Rollout.resume, ReasonRequest(reason="incident over"))
    await status_where(
        handle, lambda s: s.compartments["__default__"].phase == "waiting-for-approval", "the next approval"
    )
    await handle.execute_update(Rollout.abort, ReasonRequest(reason="change window closed"))
    result = await handle.result()
    assert result.outcome == "aborted" and result.counts == {"complete": 2, "waiting": 4}
    for i in range(3, 7):
        node = await read_node(core, f"a-{i:02d}")
        assert not node.spec.unschedulable and ROLLOUT_STATE_LABEL not in (node.metadata.labels or {})


async def test_pause_holds_a_running_node_after_its_current_stage(client, kube_worker, k8s, core):
    # A pause reaches the stages activity with its next heartbeat, at most 8 s on (0.8 of its 10 s heartbeat
    # timeout): the apply stage outlasts that.
    await lab_ready(k8s, rollout_fleet({"a": 2}), [{"stage": "apply", "seconds": 12.0}])
    handle = await start(client, kube_worker, rollout_spec("pause-in-flight"))
    await wait_for(lambda: _node_stage(client, handle.id, "apply"), what="a node applying")
    await handle.execute_update(Rollout.pause, ReasonRequest(reason="hold"))
    held = await wait_for(lambda: _node_paused_after(client, handle.id, "apply"), what="the node holding after apply",
                          timeout=20)  # fmt: skip
    assert held.stage == "apply" and held.paused
    await asyncio.sleep(1)
    status = await node_status(client, handle.id, "a-01")
    assert status is not None and status.stage == "apply", "a paused node starts no new stage"
    await handle.execute_update(Rollout.resume, ReasonRequest(reason="go"))
    assert (await handle.result()).counts == {"complete": 2}


async def test_non_interruptible_pod_holds_only_its_own_node(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 3}, protected_on="a-02", protected_finish_after=4))
    handle = await start(
        client,
        kube_worker,
        rollout_spec(
            "non-interrupt",
            podNonInterruptLabels={"matchLabels": {"workload": "training"}},
            nonInterruptRetryInterval="1s",
            policy={"default": {"budget": {"count": 3}, "strategy": {"fixed": {"initialBatch": 3}}}},
        ),
    )
    status = await status_where(handle, lambda s: s.counts.get("blocked") == 1, "a-02 blocked")
    assert status.counts.get("complete") == 2 and "non-interruptible" in status.problems["a-02"].reason
    node = await read_node(core, "a-02")
    assert not node.spec.unschedulable, "a blocked node is not held cordoned"
    result = await handle.result()
    assert result.counts == {"complete": 3}


async def test_pdb_block_is_a_wait_state(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 3}, web_pdb_min_available=3))
    handle = await start(
        client,
        kube_worker,
        rollout_spec("pdb", policy={"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}}}),
    )

    async def blocked():
        status = await node_status(client, handle.id, "a-01")
        return status if status is not None and status.blocked else None

    status = await wait_for(blocked, what="an eviction blocked by the web budget")
    assert next(iter(status.blocked.values())).budget == "apps/web"
    await PolicyV1Api(core.api_client).patch_namespaced_pod_disruption_budget(
        "web", "apps", {"spec": {"minAvailable": 2}}
    )
    assert (await handle.result()).counts == {"complete": 3}


async def test_reboot_is_verified_by_a_new_boot_id(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 1}))
    before = (await read_node(core, "a-01")).status.node_info.boot_id
    handle = await start(client, kube_worker, rollout_spec("reboot"))
    assert (await handle.result()).counts == {"complete": 1}
    child = await node_result(client, handle.id, "a-01")
    after = (await read_node(core, "a-01")).status.node_info.boot_id
    assert after != before and child.reboot_seconds >= REBOOT_SECONDS
    assert [(s.package, s.stage) for s in child.stages] == [
        ("kernel-tuning", "apply"),
        ("kernel-tuning", "config"),
        ("kernel-tuning", "interrupt"),
        ("kernel-tuning", "post-interrupt"),
    ]
    await record_history(await batch_handle(client, handle.id, "a-01"), "rollout_batch_starts_with_stages")


async def test_a_node_with_nothing_to_drain_goes_from_its_start_to_its_stages_in_one_activity(client, kube_worker, k8s,
                                                                                              core):  # fmt: skip
    """node-update-starts-with-stages: no local activity for the start (which held a whole batch until its last
    node was started), one activity from the cordon to the hand-back, the node complete and uncordoned."""
    fleet = [o for o in rollout_fleet({"a": 1}) if o["metadata"].get("namespace") != "apps"]  # no web pod to evict
    await lab_ready(k8s, fleet)
    handle = await start(client, kube_worker, rollout_spec("nothing-to-drain"))
    assert (await handle.result()).counts == {"complete": 1}
    batch = await batch_handle(client, handle.id, "a-01")
    scheduled: list[str] = []
    markers: list[str] = []
    async for event in batch.fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled.append(event.activity_task_scheduled_event_attributes.activity_type.name)
        marker = event.marker_recorded_event_attributes
        if marker.marker_name == "core_local_activity":
            markers.append(json.loads(marker.details["data"].payloads[0].data)["activity_type"])
    assert scheduled == ["run_node_stages"], scheduled
    assert "start_node_update" not in markers, markers  # the lease's signals remain local activities
    node = await read_node(core, "a-01")
    assert not node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    assert json.loads(node.metadata.annotations[PACKAGES_ANNOTATION]) == {"kernel-tuning": "1.2.0"}
    await record_history(batch, "rollout_batch_starts_with_stages_undrained")


async def test_dry_run_plans_without_writing(client, kube_worker, k8s):
    await lab_ready(k8s, rollout_fleet({"a": 4, "b": 6}))
    since = await k8s.audit_cursor()
    policy = {
        "default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}},
        "compartments": [
            {
                "name": "pool-b",
                "selector": {"matchLabels": {"pool": "b"}},
                "budget": {"percent": 50},
                "strategy": {"linear": {"initialBatch": 1, "delta": 1}},
            }
        ],
    }
    spec = rollout_spec("plan", policy=policy, dryRun=True)
    result = await (await start(client, kube_worker, spec)).result()
    plan = result.plan
    assert result.outcome == "planned" and plan.targeted == 10
    by_name = {c.name: c for c in plan.compartments}
    assert [len(b.nodes) for b in by_name["pool-b"].batches] == [1, 2, 3]
    assert [len(b.nodes) for b in by_name["__default__"].batches] == [1, 1, 1, 1]
    assert plan.worst_case_out_of_service == 4
    writes = [e for e in await k8s.audit(since=since, writes=True) if e["userAgent"].startswith("millwright")]
    assert writes == []


async def test_invalid_spec_fails_the_run_at_once(client, kube_worker):
    spec = rollout_spec("bad").model_dump(by_alias=True, mode="json")
    spec["packages"]["kernel-tuning"]["version"] = "1.2"
    spec["deploymentPolicy"]["default"]["budget"] = {"count": 1, "percent": 10}
    handle = await client.start_workflow(
        "Rollout", spec, id=f"bad-{uuid.uuid4().hex[:6]}", task_queue=kube_worker.task_queue
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 15)
    text = str(failure.value.cause)
    assert "packages.kernel-tuning.version" in text and "deploymentPolicy.default.budget" in text


async def _node_stage(client, rollout_id, stage):
    status = await node_status(client, rollout_id, "a-01")
    return status if status is not None and status.stage == stage else None


async def _node_paused_after(client, rollout_id, stage):
    status = await _node_stage(client, rollout_id, stage)
    if status and status.paused and any(s.stage == stage and s.succeeded for s in status.stages):
        return status
    return None


def test_examples_are_valid_specs():
    import yaml

    from tests.worker_process import REPO

    from_yaml = yaml.safe_load((REPO / "examples" / "rollout.yaml").read_text())
    from_json = json.loads((REPO / "examples" / "rollout.json").read_text())
    assert from_yaml == from_json
    assert RolloutInput.model_validate(from_json).workflow_id() == "rollout/lab/kernel-tuning-1-2-0"


HOT_GPU_GATE = "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP) > 85"


async def test_a_hot_gpu_holds_batches_until_it_cools(client, kube_worker, k8s, prometheus):
    await lab_ready(k8s, rollout_fleet({"a": 2}))
    await k8s.set_gpu("a-02", {"DCGM_FI_DEV_GPU_TEMP": 91}, gpu=5)
    await prometheus.wait_for(HOT_GPU_GATE, what="a-02's hot GPU")  # before the first gate check
    gate = {"prometheus": {"url": prometheus.url, "query": HOT_GPU_GATE}, "nodeConditions": ["KernelDeadlock"],
            "interval": "1s"}  # fmt: skip
    handle = await start(client, kube_worker, rollout_spec("gated", gate=gate))
    status = await status_where(
        handle,
        lambda s: s.compartments.get("__default__") and s.compartments["__default__"].phase == "gate-failing",
        "the gate failing",
    )
    assert f"{HOT_GPU_GATE} returned 1 series" in status.compartments["__default__"].note
    assert status.counts == {"waiting": 2}, "no node is admitted while the gate fails"
    await k8s.set_gpu("a-02", {"DCGM_FI_DEV_GPU_TEMP": 60}, gpu=5)
    assert (await handle.result()).counts == {"complete": 2}
    await record_history(handle, "rollout_gate_by_timer")  # its timeout's timer started, cancelled once it passed


async def test_a_gate_failing_past_its_timeout_pauses_the_rollout(client, kube_worker, k8s, prometheus):
    await lab_ready(k8s, rollout_fleet({"a": 2}))
    await k8s.set_gpu("a-02", {"DCGM_FI_DEV_GPU_TEMP": 91}, gpu=5)
    await prometheus.wait_for(HOT_GPU_GATE, what="a-02's hot GPU")
    gate = {"prometheus": {"url": prometheus.url, "query": HOT_GPU_GATE}, "interval": "10s", "timeout": "2s"}
    handle = await start(client, kube_worker, rollout_spec("gate-timeout", gate=gate))
    status = await status_where(handle, lambda s: s.paused_reason is not None, "the pause", timeout=30)
    # The timeout's timer ends the 10 s wait: one more look, then the pause.
    assert status.paused_reason.startswith(f"gate failing for 0:00:02: {HOT_GPU_GATE}"), status.paused_reason
    assert status.counts == {"waiting": 2}
    await k8s.set_gpu("a-02", {"DCGM_FI_DEV_GPU_TEMP": 60}, gpu=5)
    await handle.execute_update(Rollout.resume, ReasonRequest(reason="cooled"))
    assert (await handle.result()).counts == {"complete": 2}
    await record_history(handle, "rollout_gate_timeout_by_timer")


async def test_a_gate_prometheus_cannot_parse_fails_the_run(client, kube_worker, k8s, core, prometheus):
    await lab_ready(k8s, rollout_fleet({"a": 2}))
    typo = "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP > 85"
    handle = await start(client, kube_worker, rollout_spec("typo", gate={"prometheus": {"url": prometheus.url,
                                                                                        "query": typo}}))  # fmt: skip
    with pytest.raises(WorkflowFailureError) as ei:
        await handle.result()
    activity_error, cause = ei.value.cause, ei.value.cause.cause
    assert isinstance(cause, ApplicationError) and cause.type == "PrometheusRejected" and cause.non_retryable
    assert "bad_data" in cause.message and typo in cause.message
    assert activity_error.retry_state == RetryState.NON_RETRYABLE_FAILURE, "asked once: a retry cannot fix a query"
    assert not any(n.spec.unschedulable for n in (await core.list_node()).items), "no node was cordoned"


async def test_no_node_is_admitted_outside_the_maintenance_windows(client, kube_worker, k8s):
    await lab_ready(k8s, rollout_fleet({"a": 2}))
    today = datetime.now(UTC).strftime("%a").lower()
    other_days = [d for d in ("mon", "tue", "wed", "thu", "fri", "sat", "sun") if d != today]
    # Open every hour of every day but today (UTC), and today the window is already closed.
    windows = [{"days": other_days, "startHour": 0, "endHour": 24}]
    handle = await start(client, kube_worker, rollout_spec("windowed", maintenanceWindows=windows))
    status = await status_where(
        handle,
        lambda s: s.compartments.get("__default__") and s.compartments["__default__"].phase == "waiting-for-window",
        "the window",
    )
    assert status.counts == {"waiting": 2}
    await handle.execute_update(Rollout.abort, ReasonRequest(reason="not this week"))
    assert (await handle.result()).counts == {"waiting": 2}


async def test_nodes_are_updated_inside_an_open_maintenance_window(client, kube_worker, k8s):
    await lab_ready(k8s, rollout_fleet({"a": 2}))
    windows = [{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "startHour": 0, "endHour": 24}]
    handle = await start(client, kube_worker, rollout_spec("window-open", maintenanceWindows=windows))
    assert (await handle.result()).counts == {"complete": 2}
    # A batch with windows decides WINDOW_BY_TIMER at its start (workflows/rollout/rollout.py).
    await record_history(await batch_handle(client, handle.id, "a-01"), "rollout_batch_windows_by_timer")
