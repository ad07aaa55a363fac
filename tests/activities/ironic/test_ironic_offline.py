"""Ironic activity plumbing that needs no Ironic: models and their validation, settings, registration, errors."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.ironic.activities import IronicActivities
from activities.ironic.client import IronicConfig
from activities.ironic.errors import fault_message, ironic_error
from activities.ironic.models import NodeRef, StartClean, WaitClean
from activities.ironic.steps import BurnInPlan, BurnInStep, CleanStep, burnin_driver_info_keys
from activities.registration import activity_methods
from activities.support.secrets import SecretRef
from lab.loopback import free_port
from worker.config import ConfigError, WorkerSettings


def test_burnin_steps_know_their_driver_info_keys():
    assert burnin_driver_info_keys("burnin_memory") == [
        "agent_burnin_vm_vm",
        "agent_burnin_vm_vm-bytes",
        "agent_burnin_vm_timeout",
        "agent_burnin_vm_outputfile",
    ]
    assert burnin_driver_info_keys("burnin_disk") == [
        "agent_burnin_fio_disk_loops", "agent_burnin_fio_disk_runtime", "agent_burnin_fio_disk_outputfile",
        "agent_burnin_fio_disk_smart_test"]  # fmt: skip
    plan = BurnInPlan(steps=[
        {"step": "burnin_memory", "settings": {"vm_bytes": "90%", "timeout": 600}},
        {"step": "burnin_network", "settings": {"config": {"role": "writer", "partner": "gpu-node-002"}}},
        {"step": "burnin_gpu", "settings": {"count": 8}},
    ])  # fmt: skip
    assert plan.driver_info() == {
        "agent_burnin_vm_vm-bytes": "90%", "agent_burnin_vm_timeout": 600,
        "agent_burnin_fio_network_config": {"role": "writer", "partner": "gpu-node-002"},
        "agent_burnin_gpu_count": 8,
    }  # fmt: skip
    assert [s.to_ironic() for s in plan.clean_steps()] == [
        {"interface": "deploy", "step": "burnin_memory"}, {"interface": "deploy", "step": "burnin_network"},
        {"interface": "deploy", "step": "burnin_gpu"}]  # fmt: skip
    # A plan survives a round trip through JSON (workflow inputs, histories).
    assert BurnInPlan.model_validate_json(plan.model_dump_json()) == plan


@pytest.mark.parametrize(("model", "data", "says"), [
    (BurnInStep, {"step": "burnin_fpga"}, "step\n  Input should be 'burnin_cpu'"),
    (BurnInStep, {"step": "burnin_cpu", "settings": {"timeout": 0}}, "settings.timeout: Input should be greater than 0"),
    (BurnInStep, {"step": "burnin_cpu", "settings": {"vm": 2}}, "settings.vm: Extra inputs are not permitted"),
    (BurnInStep, {"step": "burnin_gpu", "settings": {"memory": "150%"}}, "settings.memory"),
    (BurnInStep, {"step": "burnin_network"}, "give config {role, partner} or pairing_backend_url"),
    (BurnInStep, {"step": "burnin_network", "settings": {"config": {"role": "sender", "partner": "x"}}},
     "settings.config.role"),
    (BurnInPlan, {"steps": [{"step": "burnin_cpu"}, {"step": "burnin_cpu"}]}, "repeated: burnin_cpu"),
    (CleanStep, {"interface": "deploy", "step": "burnin_cpu", "args": {"timeout": 5}},
     "args: IPA's burnin_cpu takes no arguments"),
    (CleanStep, {"interface": "bios", "step": "burnin_gpu"}, "interface: IPA's burnin_gpu is a 'deploy' step"),
    (CleanStep, {"interface": "deploy", "step": "burnin_everything"}, "step: 'burnin_everything' is not an IPA burn-in"),
    (CleanStep, {"interface": "boot", "step": "x"}, "interface\n  Input should be 'deploy'"),
    (CleanStep, {"interface": "bios", "step": "factory reset"}, "step\n  Value error, 'factory reset' is not a step"),
    (StartClean, {"node": "n1", "steps": []}, "steps\n  List should have at least 1 item"),
    (NodeRef, {"node": "a/b"}, "node\n  Value error, 'a/b' is not an Ironic node name"),
    (WaitClean, {"node": "n1", "timeout_seconds": 0}, "timeout_seconds\n  Input should be greater than 0"),
])  # fmt: skip
def test_bad_input_is_refused_naming_the_field(model, data, says):
    with pytest.raises(ValidationError) as bad:
        model.model_validate(data)
    assert says in str(bad.value)


async def test_without_settings_every_activity_fails_not_configured():
    acts = IronicActivities(None)
    assert [a.__name__ for a in activity_methods(acts)] == [
        "ironic_get_node",
        "ironic_manage",
        "ironic_set_driver_info",
        "ironic_start_clean",
        "ironic_wait_clean",
    ]
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.ironic_get_node, NodeRef(node="n1"))
    assert err.value.type == "IronicNotConfigured" and err.value.non_retryable
    assert "MILLWRIGHT_IRONIC_URL" in err.value.message


async def test_connection_refused_is_retryable_and_token_problems_are_not(monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ApplicationError) as down:
        await ActivityEnvironment().run(IronicActivities(IronicConfig(url=url)).ironic_get_node, NodeRef(node="n1"))
    assert down.value.type == "IronicUnavailable" and not down.value.non_retryable
    monkeypatch.delenv("MW_IRONIC_TOKEN_UNSET", raising=False)
    acts = IronicActivities(IronicConfig(url=url, token=SecretRef.parse("env:MW_IRONIC_TOKEN_UNSET")))
    with pytest.raises(ApplicationError) as no_token:
        await ActivityEnvironment().run(acts.ironic_get_node, NodeRef(node="n1"))
    assert no_token.value.type == "IronicNotConfigured" and no_token.value.non_retryable


def test_ironic_error_mapping():
    body = {"error_message": '{"faultcode": "Client", "faultstring": "Node x is locked by host h", "debuginfo": null}'}
    request = httpx.Request("GET", "http://ironic/v1/nodes/x")
    for status, kind, retryable in [(409, "IronicUnavailable", True), (429, "IronicUnavailable", True),
                                    (503, "IronicUnavailable", True), (400, "IronicRejected", False),
                                    (406, "IronicRejected", False), (404, "IronicNotFound", False),
                                    (401, "IronicAuth", False)]:  # fmt: skip
        err = ironic_error(httpx.Response(status, json=body, request=request), "reading node x")
        assert (err.type, not err.non_retryable) == (kind, retryable), status
        assert err.message == f"reading node x: Ironic answered {status}: Node x is locked by host h"
    assert fault_message(httpx.Response(502, text="Bad Gateway", request=request)) == "Bad Gateway"


def test_worker_settings_ironic(monkeypatch, tmp_path):
    for k in ("MILLWRIGHT_IRONIC_URL", "MILLWRIGHT_IRONIC_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    assert WorkerSettings().ironic_config() is None
    monkeypatch.setenv("MILLWRIGHT_IRONIC_TOKEN", "env:IRONIC_TOKEN")
    with pytest.raises(ConfigError, match="MILLWRIGHT_IRONIC_URL is not set"):
        WorkerSettings().ironic_config()
    monkeypatch.setenv("MILLWRIGHT_IRONIC_URL", "http://127.0.0.1:6385/")
    config = WorkerSettings().ironic_config()
    assert config.url == "http://127.0.0.1:6385" and str(config.token) == "env:IRONIC_TOKEN"
    monkeypatch.setenv("MILLWRIGHT_IRONIC_TOKEN", "gAAAAAB-a-pasted-token")
    with pytest.raises(ConfigError) as bad:
        WorkerSettings().ironic_config()
    assert "gAAAAAB" not in str(bad.value)
    monkeypatch.delenv("MILLWRIGHT_IRONIC_TOKEN")
    assert WorkerSettings().ironic_config().token is None  # noauth Ironic


def test_registry_registers_the_ironic_activities(tmp_path, monkeypatch):
    from worker import registry

    for k in ("MILLWRIGHT_IRONIC_URL", "MILLWRIGHT_IRONIC_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    registration = registry.build(WorkerSettings(kubeconfig=str(kubeconfig), metrics_port=0))
    names = {getattr(a, "__name__", "") for a in registration.activities}
    assert {"ironic_get_node", "ironic_set_driver_info", "ironic_manage", "ironic_start_clean",
            "ironic_wait_clean"} <= names  # fmt: skip
