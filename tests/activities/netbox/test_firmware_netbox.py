"""FirmwareUpdate with the real NetBox: the server's BMC read from its device's custom fields, the versions read
back stored in a custom field and the outcome journaled; a failed update journaled with the BMC's message."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import WorkflowFailureError

from activities.netbox.models import CF_BMC_CREDENTIALS, CF_BMC_URL, CF_FIRMWARE_INSTALLED
from tests.activities.netbox import test_burnin_netbox as burnin_netbox
from tests.workflows.burnin import conftest as burnin_tier
from tests.workflows.firmware.test_firmware_update import BAD_IMAGE, BUNDLE, IMAGES
from workflows.firmware.firmware_update import FirmwareUpdate, FirmwareUpdateInput

burnin_bmcs, bmc_admin, lab_hosts = burnin_tier.burnin_bmcs, burnin_tier.bmc_admin, burnin_tier.lab_hosts
bmc_secret_file = burnin_tier.bmc_secret_file
burnin_netbox_worker, journal = burnin_netbox.burnin_netbox_worker, burnin_netbox.journal  # a fixture, a helper


@pytest.fixture(scope="module")
def device(nb, bootstrapped, burnin_bmcs, bmc_secret_file):
    """A GPU server whose custom fields point at a lab BMC (one the burn-in's NetBox tests do not use)."""
    suffix = uuid.uuid4().hex[:6]
    name = burnin_bmcs.names[4]
    site = nb.dcim.sites.create(name=f"firmware-{suffix}", slug=f"firmware-{suffix}", status="active")
    maker = nb.dcim.manufacturers.get(slug="nvidia")
    dtype = nb.dcim.device_types.create(manufacturer=maker.id, model=f"HGX fw {suffix}", slug=f"hgx-fw-{suffix}")
    role = nb.dcim.device_roles.get(slug="gpu-server")
    return nb.dcim.devices.create(
        name=name, site=site.id, role=role.id, device_type=dtype.id, status="active",
        custom_fields={CF_BMC_URL: burnin_bmcs.bmc_urls[name], CF_BMC_CREDENTIALS: f"file:{bmc_secret_file}"},
    )  # fmt: skip


async def run(client, queue: str, name: str, bundle: dict):
    inp = FirmwareUpdateInput.model_validate({"server": {"name": name}, "bundle": bundle, "record_in_netbox": True})
    return await client.execute_workflow(FirmwareUpdate.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                         task_queue=queue)  # fmt: skip


async def test_the_result_lands_in_netbox(client, nb, device, bmc_admin, burnin_netbox_worker):
    await bmc_admin.set_images(IMAGES)
    result = await run(client, burnin_netbox_worker, device.name, BUNDLE)
    assert result.result == "updated"
    fields = nb.dcim.devices.get(device.id).custom_fields[CF_FIRMWARE_INSTALLED]
    assert (fields["BMC"], fields["BIOS"]) == ("25.03", "1.9.0")
    assert any("**updated**" in e and "BIOS: active 1.9.0" in e for e in journal(nb, device.id))

    bad = {"name": "bad", "components": [{"name": "BIOS", "image_uri": BAD_IMAGE, "version": "1.9.1"}]}
    with pytest.raises(WorkflowFailureError):
        await run(client, burnin_netbox_worker, device.name, bad)
    failed = [e for e in journal(nb, device.id) if "**failed**" in e]
    assert failed and "image signature does not verify" in failed[0], journal(nb, device.id)


async def test_a_bmc_whose_serial_is_not_the_devices_is_refused_before_any_write(
    client, nb, device, bmc_admin, burnin_netbox_worker
):
    await bmc_admin.set_images(IMAGES)
    writes = len(await bmc_admin.server_audit(device.name, writes=True))
    nb.dcim.devices.get(device.id).update({"serial": "S-ANOTHER-SERVER"})  # its BMC URL is another server's
    try:
        bad = {"name": "bad", "components": [{"name": "BIOS", "image_uri": BAD_IMAGE, "version": "1.9.1"}]}
        with pytest.raises(WorkflowFailureError) as failed:
            await run(client, burnin_netbox_worker, device.name, bad)
    finally:
        nb.dcim.devices.get(device.id).update({"serial": ""})
    cause = failed.value.cause
    assert cause.type == "ServerIdentityMismatch" and "S-ANOTHER-SERVER" in cause.message, cause
    assert len(await bmc_admin.server_audit(device.name, writes=True)) == writes  # nothing written to the BMC
