"""A rollout's validation gate against the lab: the host agent's GPU check on the node's own lab server, and an
in-cluster validation Job the emulator's kubelet runs. A node that fails stays cordoned with the reason on it and
counts as a failed node; a node that passes returns to service."""

from __future__ import annotations

import json
import uuid

from kubernetes.aio import client as k8s_client

from activities.kube.models import JOB_NAMESPACE, ROLLOUT_ANNOTATION, ROLLOUT_STATE_LABEL
from activities.kube.node_marks import RUNTIME_REQUIRED_TAINT, VALIDATED, VALIDATION_ANNOTATION
from lab.fleet import Fleet
from tests.kube_helpers import declare_lab_budget, read_node, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS, batch_handle, node_result, rollout_spec
from workflows.rollout.models import ReasonRequest
from workflows.rollout.rollout import Rollout

NCCL = {
    "image": "registry.local/nccl-tests",
    "version": "2.13.8",
    "command": ["all_reduce_perf", "-b", "8", "-e", "8G"],
}
# Stop at the first failed node, so a test sees the stop rule count a node that failed validation.
STOP_AT_ONE = {"default": {"budget": {"count": 2},
                           "strategy": {"fixed": {"initialBatch": 2, "batchThreshold": 100, "failureThreshold": 1}}}}  # fmt: skip


async def lab(k8s, bmc_admin, lab_hosts, names, *, faults=None, rules=()):
    """`names` as 8-GPU nodes labelled gpu=true, each played by its powered-on lab server (`faults`: name -> its
    GPU faults)."""
    nodes = [{"name": n, "gpus": 8, "labels": {"gpu": "true"}} for n in names]
    await k8s.seed(Fleet.model_validate({"cluster": "lab", "nodes": nodes, "workloads": []}).to_objects())
    await k8s.configure(jobs={**JOBS_FAST, "rules": list(rules)}, rebootSeconds=REBOOT_SECONDS)
    for name in names:
        if (faults or {}).get(name):
            await bmc_admin.set_gpu_faults(name, faults[name])
        await bmc_admin.power(name, "On")
    for name in names:
        await lab_hosts.wait_running(name)


async def start(client, worker, spec):
    await declare_lab_budget(client, worker.task_queue)
    return await client.start_workflow(
        Rollout.run, spec, id=f"{spec.workflow_id()}-{uuid.uuid4().hex[:6]}", task_queue=worker.task_queue
    )


async def stopped(handle):
    async def probe():
        status = await handle.query(Rollout.status)
        return status if status.phase == "stopped" else None

    return await wait_for(probe, what="the stop rule", timeout=90)


async def validation_events(core, node: str) -> list[str]:
    events = await core.list_namespaced_event("default")
    return [e.message for e in events.items if e.involved_object.name == node and e.reason == "ValidationFailed"]


async def assert_failed_validation(core, node: str, words: str) -> None:
    """Erroring with the validation's reason, and cordoned for it."""
    md = (await read_node(core, node)).metadata
    assert md is not None and md.labels is not None and md.annotations is not None
    assert md.labels[ROLLOUT_STATE_LABEL] == "erroring"
    assert "validation failed" in json.loads(md.annotations[ROLLOUT_ANNOTATION])["reason"]
    await assert_cordoned_for_validation(core, node, words)


async def assert_cordoned_for_validation(core, node: str, words: str) -> None:
    """Cordoned, the condition False, the reason annotation and an Event saying `words`."""
    found = await read_node(core, node)
    assert found.spec is not None and found.spec.unschedulable
    assert found.metadata is not None and found.metadata.annotations is not None
    assert words in found.metadata.annotations[VALIDATION_ANNOTATION]
    assert found.status is not None
    condition = next(c for c in found.status.conditions or [] if c.type == VALIDATED)
    assert condition.status == "False" and condition.reason == "ValidationFailed" and words in (condition.message or "")
    assert any(words in m for m in await validation_events(core, node))


async def test_a_node_back_with_a_gpu_missing_stays_cordoned_and_counts_failed(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs
):
    bad, good, later = burnin_bmcs.names[:3]
    await lab(k8s, bmc_admin, lab_hosts, [bad, good, later], faults={bad: {"missing_gpus": 1}})
    spec = rollout_spec("gpu-missing", policy=STOP_AT_ONE, validation={"expectedGpus": 8, "gpuModel": "H200"})
    handle = await start(client, kube_worker, spec)

    status = await stopped(handle)
    assert status.counts == {"erroring": 1, "complete": 1, "waiting": 1}
    assert status.compartments["__default__"].batch_state.consecutive_failures == 1
    assert "gpu_count: 8 GPUs expected, NVML sees 7" in status.problems[bad].reason
    progress = await handle.query(Rollout.progress)
    assert f"node `{bad}` erroring: validation failed: gpu_count: 8 GPUs expected, NVML sees 7" in progress.details
    await assert_failed_validation(core, bad, "8 GPUs expected, NVML sees 7")
    # Its healthy neighbour passed the same gate and is back in service.
    ok = await read_node(core, good)
    assert not ok.spec.unschedulable and VALIDATION_ANNOTATION not in (ok.metadata.annotations or {})
    assert next(c for c in ok.status.conditions if c.type == VALIDATED).status == "True"
    child = await node_result(client, handle.id, bad)
    assert child.outcome == "erroring" and child.validation is not None and not child.validation.passed
    await record_history(await batch_handle(client, handle.id, bad), "rollout_batch_inline_validation_failed")
    await handle.execute_update(Rollout.abort, ReasonRequest(reason="a GPU fell off the bus"))
    assert (await handle.result()).outcome == "aborted"


async def test_a_failing_validation_job_leaves_its_node_cordoned(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs
):
    bad, good, later = burnin_bmcs.names[:3]
    why = "all_reduce_perf: busbw 41 GB/s, below 350"
    rules = [{"node": bad, "stage": "validate", "outcome": "fail", "message": why}]
    await lab(k8s, bmc_admin, lab_hosts, [bad, good, later], rules=rules)
    handle = await start(client, kube_worker, rollout_spec("nccl", policy=STOP_AT_ONE, validation={"job": NCCL}))

    status = await stopped(handle)
    assert status.counts == {"erroring": 1, "complete": 1, "waiting": 1}
    assert why in status.problems[bad].reason
    await assert_failed_validation(core, bad, why)
    # The Job ran the validation's own image and command on the node.
    jobs = await k8s_client.BatchV1Api(core.api_client).list_namespaced_job(
        JOB_NAMESPACE, label_selector="millwright.dev/stage=validate"
    )
    ran = {j.spec.template.spec.node_name: j.spec.template.spec.containers[0] for j in jobs.items}
    assert set(ran) == {bad, good}
    assert ran[bad].image == "registry.local/nccl-tests:2.13.8" and ran[bad].command == NCCL["command"]
    await handle.execute_update(Rollout.abort, ReasonRequest(reason="NCCL below its bandwidth"))
    assert (await handle.result()).outcome == "aborted"


async def test_a_passing_validation_returns_the_node_to_service(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs
):
    node = burnin_bmcs.names[0]
    await lab(k8s, bmc_admin, lab_hosts, [node])
    loads = lab_hosts.probe(node).loads
    validation = {"expectedGpus": 8, "minPcieWidth": 16, "loadSeconds": 0.5, "job": NCCL}
    handle = await start(client, kube_worker, rollout_spec("validated", validation=validation))
    assert (await handle.result()).counts == {"complete": 1}

    found = await read_node(core, node)
    assert not found.spec.unschedulable and found.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    assert VALIDATION_ANNOTATION not in (found.metadata.annotations or {})
    assert next(c for c in found.status.conditions if c.type == VALIDATED).status == "True"
    assert not await validation_events(core, node)
    child = await node_result(client, handle.id, node)
    assert child.validation is not None and child.validation.passed and not child.validation.findings
    # The load window ran on the node's own simulated GPUs.
    assert lab_hosts.probe(node).loads == loads + 1
    await record_history(await batch_handle(client, handle.id, node), "rollout_batch_inline_validated")


async def test_validation_switched_off_explicitly_runs_no_check(client, kube_worker, k8s, core, bmc_admin, lab_hosts,
                                                                burnin_bmcs):  # fmt: skip
    node = burnin_bmcs.names[0]
    await lab(k8s, bmc_admin, lab_hosts, [node], faults={node: {"missing_gpus": 1}})
    spec = rollout_spec("unvalidated", validation={"enabled": False, "expectedGpus": 8})
    handle = await start(client, kube_worker, spec)
    assert (await handle.result()).counts == {"complete": 1}
    found = await read_node(core, node)
    assert not found.spec.unschedulable
    assert not any(c.type == VALIDATED for c in found.status.conditions)


async def test_the_runtime_required_taint_stays_on_a_new_node_that_fails_validation(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs
):
    bad, good = burnin_bmcs.names[:2]
    await lab(k8s, bmc_admin, lab_hosts, [bad, good], faults={bad: {"missing_gpus": 2}})
    spec = rollout_spec("new-nodes", runtimeRequired=True, autoTaintNewNodes=True, validation={"expectedGpus": 8})
    result = await (await start(client, kube_worker, spec)).result()
    assert result.counts == {"erroring": 1, "complete": 1}

    def tainted(node) -> bool:
        return any(t.key == RUNTIME_REQUIRED_TAINT["key"] for t in node.spec.taints or [])

    assert tainted(await read_node(core, bad))  # NodeWright's new-node gate waits for the validation too
    assert not tainted(await read_node(core, good))
    await assert_cordoned_for_validation(core, bad, "8 GPUs expected, NVML sees 6")
