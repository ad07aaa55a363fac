"""NodeRma (workflows/remediation/rma.py): a quarantined node's evidence goes to the ticket webhook, the run waits
for `replaced` through a worker restart, then burns the server in, validates the node and returns it to service; a
node that is not quarantined is refused before any write. The lab's BMCs and host agents are the burn-in tier's."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError

from activities.kube.models import CORDONED_BY
from activities.node_health import QUARANTINE_ANNOTATION, QUARANTINE_TAINT
from lab.fleet import Fleet
from lab.webhook import WebhookAdmin, WebhookReceiver
from tests.workflows.burnin.test_server_burnin import STRESS, resets
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.remediation.rma import NodeRma, NodeRmaInput, Replacement

QUARANTINED_BY = "remediation/lab/{}"


def quarantined_node(name: str) -> list[dict]:
    objects = Fleet.model_validate({"cluster": "lab", "nodes": [{"name": name, "gpus": 8}]}).to_objects()
    node = next(o for o in objects if o["kind"] == "Node")
    node["spec"]["unschedulable"] = True
    node["spec"]["taints"] = [{"key": QUARANTINE_TAINT, "value": "true", "effect": "NoSchedule"}]
    node["metadata"]["annotations"] |= {
        CORDONED_BY: QUARANTINED_BY.format(name),
        QUARANTINE_ANNOTATION: json.dumps({"reason": "GPU3 row-remap failure: needs an RMA",
                                           "by": QUARANTINED_BY.format(name)}),
    }  # fmt: skip
    return objects


def rma_input(bmcs, name: str, **more) -> NodeRmaInput:
    return NodeRmaInput.model_validate({
        "cluster": "lab", "node": name, "netbox": False, "bmc": {"url": bmcs.bmc_urls[name]},
        "expected": {"gpus": 8, "gpu_model": "H200"},
        "burn_in": {"stress_seconds": STRESS, "dcgm_level": None, "record_in_netbox": False, "boot_timeout": "PT30S"},
        "validation": {"expected_gpus": 8}, **more,
    })  # fmt: skip


@asynccontextmanager
async def rma_worker(client, kubeconfig_path, bmc_secret_file, queue: str):
    """A worker process's registration on `queue`: leaving the block stops it, as a restart would."""
    from worker import registry
    from worker.config import WorkerSettings

    settings = WorkerSettings(
        kubeconfig=str(kubeconfig_path), metrics_port=0, bmc_credentials=f"file:{bmc_secret_file}"
    )
    registration = registry.build(settings)
    try:
        async with registry.new_worker(client, registration, queue):
            yield
    finally:
        await registration.close()


async def wait_phase(handle: WorkflowHandle, phase: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (p := await handle.query(NodeRma.progress)).phase != phase:
        assert time.monotonic() < deadline, f"never reached {phase}; at {p.phase}: {p.details}"
        await asyncio.sleep(0.2)


async def test_a_node_not_quarantined_is_refused_before_any_write(client, burnin_bmcs, bmc_admin, burnin_worker, k8s):
    name = burnin_bmcs.names[6]
    await k8s.seed(Fleet.model_validate({"cluster": "lab", "nodes": [{"name": name, "gpus": 8}]}).to_objects())
    inp = rma_input(burnin_bmcs, name)
    with pytest.raises(WorkflowFailureError) as failed:
        await client.execute_workflow(NodeRma.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                      task_queue=burnin_worker)  # fmt: skip
    assert failed.value.cause.type == "NodeNotQuarantined" and f"{name} in lab is not quarantined" in str(
        failed.value.cause.message)  # fmt: skip


async def test_waits_for_the_parts_through_a_worker_restart_then_burns_in_validates_and_returns(
    client, burnin_bmcs, bmc_admin, lab_hosts, kubeconfig_path, bmc_secret_file, k8s, core
):
    name = burnin_bmcs.names[6]
    await k8s.seed(quarantined_node(name))
    queue = f"rma-{uuid.uuid4().hex[:8]}"
    with WebhookReceiver() as receiver:
        ticket = WebhookAdmin(receiver.url)
        inp = rma_input(burnin_bmcs, name, ticket={"url": f"{receiver.url}/hooks/rma"})
        async with rma_worker(client, kubeconfig_path, bmc_secret_file, queue):
            handle = await client.start_workflow(NodeRma.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                                 task_queue=queue)  # fmt: skip
            await wait_phase(handle, "awaiting-replacement")
        [request] = await ticket.received()
        await ticket.aclose()
    body = request["body"]
    assert body["event"] == "rma-requested" and body["node"] == name
    evidence = body["evidence"]
    assert evidence["quarantine_reason"] == "GPU3 row-remap failure: needs an RMA" and evidence["serial"]
    assert len(evidence["gpu_serials"]) == 8, evidence
    assert await resets(bmc_admin, name) == []  # nothing touched the server while it waited

    # No worker now: the run waits in the server. A replacement is only accepted by a worker, after the restart.
    async with rma_worker(client, kubeconfig_path, bmc_secret_file, queue):
        with pytest.raises(WorkflowUpdateFailedError) as refused:  # the update's model names the field
            await handle.execute_update(NodeRma.replaced, {"parts": [], "by": "ops"})
        assert "parts" in str(refused.value.cause), refused.value.cause
        await handle.execute_update(NodeRma.replaced, Replacement(parts=["GPU3 (new serial 1654922004999)"],
                                                                  by="dc-tech@example.com", ticket="VEND-1234"))  # fmt: skip
        result = await handle.result()
    assert result.outcome == "returned", result
    assert result.burn_in == "passed" and result.validation == "passed"
    assert result.replacement is not None and result.replacement.ticket == "VEND-1234"
    assert "requested (HTTP 204)" in result.ticket
    assert await resets(bmc_admin, name)  # the burn-in power-cycled the server
    node = await core.read_node(name)
    assert not node.spec.unschedulable and not node.spec.taints
    assert QUARANTINE_ANNOTATION not in (node.metadata.annotations or {})
    await record_history(handle, "node_rma_returned")
