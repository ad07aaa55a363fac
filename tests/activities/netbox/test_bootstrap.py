"""`millwright inventory bootstrap` against the real NetBox: creates, then changes nothing."""

from __future__ import annotations

import uuid

from activities.netbox.bootstrap import BOOTSTRAP_SECTIONS
from activities.netbox.models import CF_BURNIN_RESULT, CF_IB_PORT_GUID, DEVICE_STATUSES, TAG_QUARANTINE
from tests.cli_in_process import cli
from workflows.inventory.bootstrap import InventoryBootstrap, InventoryBootstrapInput

ALL_LABELS = {o.label for objs in BOOTSTRAP_SECTIONS.values() for o in objs} | {
    f"device status {s}" for s in DEVICE_STATUSES
}


async def bootstrap(client, worker):
    return await client.execute_workflow(
        InventoryBootstrap.run,
        InventoryBootstrapInput(),
        id=f"inventory-bootstrap/{uuid.uuid4().hex[:8]}",
        task_queue=worker.task_queue,
    )


async def test_bootstrap_twice_second_changes_nothing(client, netbox_worker, nb, temporal_address):
    fresh = nb.extras.custom_fields.get(name=CF_BURNIN_RESULT) is None

    first = await bootstrap(client, netbox_worker)
    assert set(first.created) | set(first.existing) | {u.split(" (")[0] for u in first.updated} == ALL_LABELS
    if fresh:  # the usual case: this file runs first on a freshly restored database
        assert f"custom field {CF_BURNIN_RESULT}" in first.created
        assert f"tag {TAG_QUARANTINE}" in first.created

    # Real NetBox objects, with the types and validation NetBox enforces.
    cf = nb.extras.custom_fields.get(name=CF_BURNIN_RESULT)
    assert cf.type.value == "select" and cf.choice_set.name == "millwright-burnin-results"
    assert list(cf.object_types) == ["dcim.device"]
    guid = nb.extras.custom_fields.get(name=CF_IB_PORT_GUID)
    assert guid.validation_regex and list(guid.object_types) == ["dcim.interface"]
    assert nb.extras.tags.get(slug=TAG_QUARANTINE) is not None
    assert nb.dcim.device_roles.get(slug="gpu-server") is not None

    second = await bootstrap(client, netbox_worker)
    assert second.created == [] and second.updated == []
    assert set(second.existing) == ALL_LABELS

    # The CLI, as operators run it, against the same worker: a third run, still no change.
    done = await cli("inventory", "bootstrap", "--address", temporal_address, "--task-queue", netbox_worker.task_queue,
                     timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "created (0):" in done.stdout and "nothing changed" in done.stdout
    assert f"custom field {CF_BURNIN_RESULT}" in done.stdout


async def test_bootstrap_adds_a_missing_object_type_without_touching_the_rest(client, netbox_worker, nb, bootstrapped):
    # Someone narrowed a Millwright custom field by hand: the bootstrap restores what it needs, nothing else.
    cf = nb.extras.custom_fields.get(name="millwright_gpu_uuid")
    cf.update({"object_types": ["dcim.inventoryitem"]})
    result = await bootstrap(client, netbox_worker)
    assert result.created == []
    assert result.updated == ["custom field millwright_gpu_uuid (object_types)"]
    assert sorted(nb.extras.custom_fields.get(name="millwright_gpu_uuid").object_types) == [
        "dcim.inventoryitem",
        "dcim.module",
    ]
