"""ServerBurnIn's Ironic path through a real worker and the real Ironic: manual cleaning with the requested
steps, `last_error` as the evidence when it fails."""

from __future__ import annotations

import uuid

import pytest_asyncio

from workflows.burnin.server_burnin import ServerBurnIn, ServerBurnInInput


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def ironic_worker(client, kubeconfig_path, ironic_lab):
    from tests.workers import settings_worker

    async with settings_worker(client, kubeconfig_path, "ironic", ironic_url=ironic_lab.url) as queue:
        yield queue


def ironic_burn_in(node: str, steps: list[dict], **ironic) -> ServerBurnInInput:
    return ServerBurnInInput.model_validate({
        "server": {"name": node, "ironic": {"node": node, "steps": steps, "poll_seconds": 0.2, **ironic}},
        "settings": {"record_in_netbox": False},
    })  # fmt: skip


async def run(client, queue: str, inp: ServerBurnInInput):
    return await client.execute_workflow(ServerBurnIn.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                         task_queue=queue)  # fmt: skip


async def test_cleaning_with_steps_the_node_offers_passes(client, ironic_worker, enroll, ironic_http):
    node = enroll()
    steps = [{"interface": "bios", "step": "factory_reset"}, {"interface": "vendor", "step": "log_passthrough"}]
    result = await run(client, ironic_worker, ironic_burn_in(node, steps, driver_info={"agent_burnin_cpu_timeout": 60}))
    assert (result.result, result.findings) == ("passed", [])
    body = ironic_http.get(f"/nodes/{node}").json()
    assert body["provision_state"] == "manageable"
    assert body["driver_info"]["agent_burnin_cpu_timeout"] == 60


async def test_ipa_burn_in_steps_on_fake_hardware_fail_with_ironics_last_error(client, ironic_worker, enroll):
    node = enroll()
    result = await run(client, ironic_worker, ironic_burn_in(node, [{"interface": "deploy", "step": "burnin_cpu"}]))
    assert result.result == "failed"
    [finding] = result.findings
    assert finding.check == "ironic" and "does not support this clean step" in finding.evidence
