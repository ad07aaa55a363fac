"""ServerBurnIn end to end with the real NetBox: the server found by name, its BMC and expectations read from
its custom fields, the verdict recorded (status, burn-in fields, GPUs, tags, journal evidence)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import pytest_asyncio

from activities.netbox.models import (
    CF_BMC_CREDENTIALS,
    CF_BMC_URL,
    CF_BURNIN_RESULT,
    CF_EXPECTED_GPUS,
    CF_FIRMWARE_BASELINE,
    CF_GPU_MODEL,
    TAG_QUARANTINE,
)
from lab.bmc import DEFAULT_FIRMWARE
from tests.workflows.burnin import conftest as burnin_tier
from workflows.burnin.server_burnin import TAG_BURNIN_FAILED, TAG_BURNIN_PASSED, ServerBurnIn, ServerBurnInInput

# The burn-in tier's lab (BMCs, hosts running the agent), as fixtures of this module.
burnin_bmcs, bmc_admin, lab_hosts = burnin_tier.burnin_bmcs, burnin_tier.bmc_admin, burnin_tier.lab_hosts
bmc_secret_file = burnin_tier.bmc_secret_file


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def burnin_netbox_worker(client, kubeconfig_path, netbox_lab, netbox_token_file, bootstrapped):
    from tests.workers import settings_worker

    # No default BMC credentials: each server's reference comes from NetBox.
    async with settings_worker(client, kubeconfig_path, "burnin-netbox", netbox_url=netbox_lab.url,
                               netbox_token=f"file:{netbox_token_file}") as queue:  # fmt: skip
        yield queue


@pytest.fixture(scope="module")
def servers(nb, bootstrapped, burnin_bmcs, bmc_secret_file):
    """Four planned GPU servers whose custom fields point at four lab BMCs."""
    suffix = uuid.uuid4().hex[:6]
    site = nb.dcim.sites.create(name=f"burnin-{suffix}", slug=f"burnin-{suffix}", status="active")
    maker = nb.dcim.manufacturers.get(slug="nvidia")
    dtype = nb.dcim.device_types.create(manufacturer=maker.id, model=f"HGX {suffix}", slug=f"hgx-{suffix}")
    role = nb.dcim.device_roles.get(slug="gpu-server")
    made = {}
    for name in burnin_bmcs.names[:4]:
        made[name] = nb.dcim.devices.create(
            name=name, site=site.id, role=role.id, device_type=dtype.id, status="planned",
            custom_fields={CF_BMC_URL: burnin_bmcs.bmc_urls[name], CF_BMC_CREDENTIALS: f"file:{bmc_secret_file}",
                           CF_EXPECTED_GPUS: 8, CF_GPU_MODEL: "H200", CF_FIRMWARE_BASELINE: DEFAULT_FIRMWARE},
        )  # fmt: skip
    return made


def journal(nb, device_id: int) -> list[str]:
    return [e.comments for e in nb.extras.journal_entries.filter(assigned_object_type="dcim.device",
                                                                 assigned_object_id=device_id)]  # fmt: skip


# Each simulated GPU fault, and the evidence its journal entry must carry.
FAULTS = [({"pending_remaps": [3]}, ["remap_pending", "GPU3"]),
          ({"xid_under_load": {"gpu": 5, "xid": 79}}, ["Xid 79", "GPU5"]),
          ({"pcie_width": {"gpu": 1, "width": 8}}, ["pcie_link", "GPU1", "x8"])]  # fmt: skip


async def test_verdicts_land_in_netbox(client, nb, servers, bmc_admin, lab_hosts, burnin_netbox_worker):
    healthy, *faulty = list(servers)
    for name, (fault, _) in zip(faulty, FAULTS):
        await bmc_admin.set_gpu_faults(name, fault)
    runs = []
    for name in servers:
        inp = ServerBurnInInput.model_validate(
            {"server": {"name": name}, "settings": {"stress_seconds": 2, "dcgm_level": None, "boot_timeout": "PT30S"}}
        )
        runs.append(client.execute_workflow(ServerBurnIn.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                            task_queue=burnin_netbox_worker))  # fmt: skip
    results = await asyncio.gather(*runs)
    assert [r.result for r in results] == ["passed", "failed", "failed", "failed"]

    good = nb.dcim.devices.get(servers[healthy].id)
    assert good.status.value == "active"
    assert good.custom_fields[CF_BURNIN_RESULT]["value"] == "passed"
    assert {t.slug for t in good.tags} == {TAG_BURNIN_PASSED}
    assert len(list(nb.dcim.inventory_items.filter(device_id=good.id, role="gpu"))) == 8

    for name, (_, evidence) in zip(faulty, FAULTS):
        bad = nb.dcim.devices.get(servers[name].id)
        assert bad.status.value == "failed"
        assert bad.custom_fields[CF_BURNIN_RESULT]["value"] == "failed"
        assert {t.slug for t in bad.tags} == {TAG_QUARANTINE, TAG_BURNIN_FAILED}
        entries = "\n".join(journal(nb, bad.id))
        assert all(e in entries for e in evidence), (name, evidence, entries)
        assert "staged" in entries and "**failed**" in entries  # planned → staged → failed, each journaled
        assert (await bmc_admin.server(name))["power"] == "Off"

    for run in results:
        async for execution in client.list_workflows(f"WorkflowId STARTS_WITH 'burn-in/{run.server}'"):
            history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
            assert burnin_tier.BMC_PASSWORD not in history.to_json()


async def test_a_burn_in_that_cannot_reach_a_verdict_is_recorded_as_aborted(
    client, nb, servers, burnin_bmcs, burnin_netbox_worker
):
    from temporalio.client import WorkflowFailureError

    device = servers[burnin_bmcs.names[0]]
    name = f"{burnin_bmcs.names[0]}-x"
    twin = nb.dcim.devices.create(
        name=name,
        site=device.site.id,
        role=device.role.id,
        device_type=device.device_type.id,
        status="planned",
        custom_fields={
            CF_BMC_URL: burnin_bmcs.bmc_urls[burnin_bmcs.names[0]],
            CF_BMC_CREDENTIALS: "env:MILLWRIGHT_NO_SUCH_SECRET",
        },
    )
    inp = ServerBurnInInput.model_validate({"server": {"name": name}})
    with pytest.raises(WorkflowFailureError) as failed:
        await client.execute_workflow(ServerBurnIn.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                      task_queue=burnin_netbox_worker)  # fmt: skip
    assert "MILLWRIGHT_NO_SUCH_SECRET" in str(failed.value.cause.cause)
    twin = nb.dcim.devices.get(twin.id)
    assert twin.status.value == "staged"  # no verdict on the server
    assert twin.custom_fields[CF_BURNIN_RESULT]["value"] == "aborted"
    assert any("stopped before a verdict" in c for c in journal(nb, twin.id))
