"""The cluster's validation default (workflows/validation/defaults.py): the ConfigMap
millwright-system/millwright-validation validates a run whose input gives no `validation`; an input's own wins; a
ConfigMap the settings refuse fails the run, naming the field, before the node is touched."""

from __future__ import annotations

import json

import pytest
from temporalio.client import WorkflowFailureError

from activities.kube.models import JOB_NAMESPACE, VALIDATION_DEFAULT_CONFIGMAP
from tests.kube_helpers import read_node
from tests.workflows.burnin.test_burnin_node import validated_node
from tests.workflows.burnin.test_server_burnin import start as start_burn_in
from tests.workflows.burnin.test_server_burnin import wait_phase
from tests.workflows.firmware.test_firmware_update import node_in_service, update_input
from tests.workflows.firmware.test_firmware_update import start as start_update
from tests.workflows.maintenance.test_node_maintenance import maintenance, record_history, start
from tests.workflows.rollout.helpers import rollout_spec
from tests.workflows.validation.test_rollout_validation import STOP_AT_ONE, assert_cordoned_for_validation, lab, stopped
from tests.workflows.validation.test_rollout_validation import start as start_rollout
from workflows.rollout.models import ReasonRequest
from workflows.rollout.rollout import Rollout

X8 = {"pcie_width": {"gpu": 3, "width": 8}}  # a link trained at x8: fails a default asking for x16


async def declare(core, settings: dict | str) -> None:
    """The operator's ConfigMap, as `kubectl apply` would leave it."""
    text = settings if isinstance(settings, str) else json.dumps(settings)
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": VALIDATION_DEFAULT_CONFIGMAP, "namespace": JOB_NAMESPACE},
            "data": {"validation": text}}  # fmt: skip
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOB_NAMESPACE}}
    await core.create_namespace(namespace)
    await core.create_namespaced_config_map(JOB_NAMESPACE, body)


async def test_the_cluster_default_validates_a_maintenance_without_validation(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs
):
    node = burnin_bmcs.names[0]
    await lab(k8s, bmc_admin, lab_hosts, [node], faults={node: X8})
    await declare(core, "minPcieWidth: 16\n")  # YAML, camelCase as in a rollout spec
    handle = await start(client, kube_worker, maintenance(node, uncordon_after=True))
    result = await handle.result()

    assert result.outcome == "validation-failed" and not result.uncordoned
    assert result.validation is not None and "x8" in result.validation.reason
    await assert_cordoned_for_validation(core, node, "x8")
    await record_history(handle, "node_maintenance_cluster_validation_default")


async def test_an_input_switching_validation_off_wins_over_the_cluster_default(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs
):
    node = burnin_bmcs.names[0]
    await lab(k8s, bmc_admin, lab_hosts, [node], faults={node: X8})
    await declare(core, {"min_pcie_width": 16})
    inp = maintenance(node, uncordon_after=True, validation={"enabled": False})
    result = await (await start(client, kube_worker, inp)).result()

    assert result.outcome == "completed" and result.uncordoned and result.validation is None
    assert not (await read_node(core, node)).spec.unschedulable


@pytest.mark.parametrize(
    ("settings", "says"),
    [({"expectedGpus": "eight"}, "validation.expectedGpus: Input should be a valid integer"),
     ({"minPcieWidht": 16}, "validation.minPcieWidht: Extra inputs are not permitted"),
     ("[16]", "validation must be a mapping of the validation settings, not list")],
)  # fmt: skip
async def test_a_bad_cluster_default_fails_the_run_before_the_node_is_touched(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs, settings, says
):
    node = burnin_bmcs.names[0]
    await lab(k8s, bmc_admin, lab_hosts, [node])
    await declare(core, settings)
    with pytest.raises(WorkflowFailureError) as failed:
        await (await start(client, kube_worker, maintenance(node, uncordon_after=True))).result()
    cause = failed.value.cause
    while getattr(cause, "type", None) != "InvalidValidationDefault" and cause.cause is not None:
        cause = cause.cause  # through the activity's error, when the activity refused the ConfigMap
    assert cause.type == "InvalidValidationDefault", cause
    assert f"ConfigMap {JOB_NAMESPACE}/{VALIDATION_DEFAULT_CONFIGMAP} in lab" in cause.message and says in cause.message
    assert not (await read_node(core, node)).spec.unschedulable  # refused before the cordon


async def test_the_cluster_default_validates_a_burned_in_node(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = burnin_bmcs.names[7]
    inp = await validated_node(burnin_bmcs, bmc_admin, k8s, power_link, name)
    inp.settings.validation = None  # the cluster's default instead
    await declare(core, {"expectedGpus": 8})
    handle = await start_burn_in(client, burnin_worker, inp)
    await wait_phase(handle, "booting-disk")
    await bmc_admin.set_gpu_faults(name, {"missing_gpus": 1})  # off the bus in the disk's boot
    result = await handle.result()

    assert result.result == "failed" and result.validation is not None and not result.validation.passed
    assert (await read_node(core, name)).spec.unschedulable


async def test_the_cluster_default_validates_a_node_after_its_firmware(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = await node_in_service(burnin_bmcs, bmc_admin, k8s, power_link)
    await bmc_admin.set_gpu_faults(name, {"missing_gpus": 1})  # a GPU off the bus once it boots
    await declare(core, {"expectedGpus": 8})
    result = await (await start_update(client, burnin_worker, update_input(burnin_bmcs, name))).result()

    assert result.result == "validation-failed" and result.validation is not None, result
    assert (await read_node(core, name)).spec.unschedulable


async def test_the_cluster_default_validates_a_rollouts_nodes(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs
):
    bad, good, later = burnin_bmcs.names[:3]
    await lab(k8s, bmc_admin, lab_hosts, [bad, good, later], faults={bad: {"missing_gpus": 1}})
    await declare(core, {"expectedGpus": 8})
    handle = await start_rollout(client, kube_worker, rollout_spec("default-gate", policy=STOP_AT_ONE))

    status = await stopped(handle)
    assert status.counts == {"erroring": 1, "complete": 1, "waiting": 1}
    assert "gpu_count: 8 GPUs expected, NVML sees 7" in status.problems[bad].reason
    await handle.execute_update(Rollout.abort, ReasonRequest(reason="a GPU fell off the bus"))
    await record_history(handle, "rollout_cluster_validation_default")
