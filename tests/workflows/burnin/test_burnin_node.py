"""ServerBurnIn of a server that is a Kubernetes node (workflows/burnin/node_guard.py): refused while in service, or taken
out of service (lease, cordon, drain) before the power cycle and put back after a pass; quarantined after a failure.

The lab's server power reaches the emulated node (lab/node_power.py): NotReady while off, a new boot ID at each
power-on, as a kubelet reports it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import WorkflowFailureError

from activities.node_health import QUARANTINE_ANNOTATION, QUARANTINE_TAINT
from lab.fleet import Fleet
from tests.kube_helpers import pods_on
from tests.workflows.burnin.test_server_burnin import burn_in_input, resets, start, wait_phase
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import budget_workflow_id
from workflows.burnin.server_burnin import BurnInSettings, ServerBurnInInput
from workflows.validation.models import ValidationSettings


def node_fleet(name: str, *, cordoned_by: str | None = None) -> list[dict]:
    objects = Fleet.model_validate({
        "cluster": "lab", "nodes": [{"name": name, "gpus": 8}, {"name": "spare", "gpus": 8}],
        "workloads": [{"name": "trainer", "namespace": "training", "replicas": 1, "gpus": 8, "nodes": [name],
                       "emptyDir": True, "terminationGracePeriodSeconds": 1}],
    }).to_objects()  # fmt: skip
    if cordoned_by:
        node = next(o for o in objects if o["kind"] == "Node" and o["metadata"]["name"] == name)
        node["spec"]["unschedulable"] = True
        node["metadata"]["annotations"]["millwright.dev/cordoned-by"] = cordoned_by
    return objects


def as_node(inp: ServerBurnInInput, **kubernetes) -> ServerBurnInInput:
    data = inp.model_dump(mode="json")
    data["server"]["kubernetes"] = {"cluster": "lab", **kubernetes}
    return ServerBurnInInput.model_validate(data)


@pytest_asyncio.fixture(loop_scope="session")
async def power_link(bmc_admin, core):
    from lab.node_power import NodePowerLink

    async with NodePowerLink(bmc_admin, core, []) as link:
        yield link


async def follow(link, admin, name: str) -> None:
    await admin.power(name, "On")  # a node in service runs
    link.follow(name)
    await link.poll_once(first=True)


async def test_a_node_in_service_is_refused_before_any_power_change(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, power_link
):
    name = burnin_bmcs.names[7]
    await k8s.seed(node_fleet(name))
    await follow(power_link, bmc_admin, name)
    handle = await start(client, burnin_worker, as_node(burn_in_input(burnin_bmcs, name)))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    assert cause.type == "NodeInService", cause
    assert f"{name} is a Kubernetes node in service in lab" in cause.message
    assert "take_out_of_service: true" in cause.message and "NodeMaintenance" in cause.message
    assert await resets(bmc_admin, name) == []  # the burn-in changed nothing


async def test_taken_out_of_service_then_back_after_a_pass(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = burnin_bmcs.names[7]
    await k8s.seed(node_fleet(name))
    await follow(power_link, bmc_admin, name)
    boot_before = (await core.read_node(name)).status.node_info.boot_id
    inp = as_node(burn_in_input(burnin_bmcs, name, stress_seconds=2), take_out_of_service=True,
                  drain={"delete_emptydir_data": True, "eviction_retry_interval": 0.5})  # fmt: skip
    handle = await start(client, burnin_worker, inp)
    await wait_phase(handle, "stressing")
    node = await core.read_node(name)
    assert node.spec.unschedulable and node.metadata.annotations["millwright.dev/cordoned-by"] == handle.id
    assert not [p for p in await pods_on(core, name) if p.metadata.namespace == "training"]  # drained first
    leases = await client.get_workflow_handle(budget_workflow_id("lab")).query(DisruptionBudget.leases)
    assert [(lease.node, lease.holder, lease.state) for lease in leases] == [(name, handle.id, "granted")]

    result = await handle.result()
    assert result.result == "passed", result.summary()
    await record_history(handle, "server_burn_in_node_out_of_service")
    node = await core.read_node(name)
    assert not node.spec.unschedulable and "millwright.dev/cordoned-by" not in (node.metadata.annotations or {})
    assert node.status.node_info.boot_id != boot_before  # uncordoned once back from its disk, Ready
    assert await client.get_workflow_handle(budget_workflow_id("lab")).query(DisruptionBudget.leases) == []
    assert any(f"node {name}" in note and "back in service" in note for note in result.notes), result.notes


async def test_a_failed_node_stays_cordoned_and_quarantined_with_the_reason(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = burnin_bmcs.names[7]
    await k8s.seed(node_fleet(name))
    await follow(power_link, bmc_admin, name)
    await bmc_admin.set_firmware(name, {"BMC": "23.11"})
    inp = as_node(burn_in_input(burnin_bmcs, name), take_out_of_service=True, drain={"delete_emptydir_data": True})
    result = await (await start(client, burnin_worker, inp)).result()
    assert result.result == "failed"
    node = await core.read_node(name)
    assert node.spec.unschedulable
    reason = json.loads(node.metadata.annotations[QUARANTINE_ANNOTATION])["reason"]
    assert reason.startswith("burn-in failed: firmware BMC") and "23.11" in reason
    assert any(t.key == QUARANTINE_TAINT for t in node.spec.taints or [])
    assert await client.get_workflow_handle(budget_workflow_id("lab")).query(DisruptionBudget.leases) == []


async def test_a_node_someone_else_cordoned_is_burned_in_and_left_to_them(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = burnin_bmcs.names[7]
    await k8s.seed(node_fleet(name, cordoned_by="node-maintenance/lab/x"))
    await follow(power_link, bmc_admin, name)
    result = await (await start(client, burnin_worker, as_node(burn_in_input(burnin_bmcs, name)))).result()
    assert result.result == "passed", result.summary()
    node = await core.read_node(name)
    assert (
        node.spec.unschedulable and node.metadata.annotations["millwright.dev/cordoned-by"] == "node-maintenance/lab/x"
    )
    assert any("cordoned by node-maintenance/lab/x" in note for note in result.notes), result.notes


def test_the_example_input_takes_its_node_out_of_service():
    example = json.loads((Path(__file__).parents[3] / "examples" / "server-burn-in.json").read_text())
    example["server"]["bmc"]["url"] = "https://127.0.0.1:1"  # what `lab up` writes in
    kubernetes = ServerBurnInInput.model_validate(example).server.kubernetes
    assert kubernetes is not None and kubernetes.take_out_of_service and kubernetes.drain.delete_emptydir_data


async def validated_node(bmcs, admin, k8s, link, name: str) -> ServerBurnInInput:
    """A node in service and the input of a burn-in that takes it out and validates it before its return."""
    await k8s.seed(node_fleet(name))
    await follow(link, admin, name)
    return as_node(burn_in_input(bmcs, name, stress_seconds=2, validation={"expected_gpus": 8}),
                   take_out_of_service=True, drain={"delete_emptydir_data": True})  # fmt: skip


async def test_a_passed_node_failing_validation_on_its_disk_stays_cordoned(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = burnin_bmcs.names[7]
    inp = await validated_node(burnin_bmcs, bmc_admin, k8s, power_link, name)
    handle = await start(client, burnin_worker, inp)
    await wait_phase(handle, "booting-disk")  # the burn-in passed; a GPU falls off the bus in the disk's boot
    await bmc_admin.set_gpu_faults(name, {"missing_gpus": 1})
    result = await handle.result()

    assert result.result == "failed" and result.validation is not None and not result.validation.passed
    assert [f.check for f in result.findings if f.severity == "fail"] == ["validation"], result.summary()
    node = await core.read_node(name)
    assert node.spec.unschedulable and node.metadata.annotations["millwright.dev/cordoned-by"] == handle.id
    reason = json.loads(node.metadata.annotations[QUARANTINE_ANNOTATION])["reason"]
    assert reason.startswith("burn-in failed: validation") and "7" in reason, reason
    assert await client.get_workflow_handle(budget_workflow_id("lab")).query(DisruptionBudget.leases) == []
    await record_history(handle, "server_burn_in_node_validation_failed")


async def test_a_passed_node_passing_validation_is_uncordoned(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = burnin_bmcs.names[7]
    inp = await validated_node(burnin_bmcs, bmc_admin, k8s, power_link, name)
    result = await (await start(client, burnin_worker, inp)).result()

    assert result.result == "passed" and result.validation is not None and result.validation.passed, result.summary()
    assert not (await core.read_node(name)).spec.unschedulable


def test_validation_without_the_disk_boot_is_refused_at_the_edge():
    with pytest.raises(ValueError, match="validation gates a node's return to service from its disk"):
        BurnInSettings(boot_disk_after_pass=False, validation=ValidationSettings())
    BurnInSettings(boot_disk_after_pass=False, validation=ValidationSettings(enabled=False))
