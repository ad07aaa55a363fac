"""FirmwareUpdate of one server through the lab BMC's UpdateService (lab/bmc_update.py), the server a Kubernetes
node in service: leased, cordoned, drained, updated, verified, uncordoned; a bad image stops it with the BMC's
message; a re-run changes nothing."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from temporalio.client import WorkflowFailureError, WorkflowHandle

from activities.node_health import QUARANTINE_ANNOTATION
from lab.bmc import DEFAULT_FIRMWARE, normalize_spec
from tests.workflows.burnin.conftest import BMC_PASSWORD
from tests.workflows.burnin.test_burnin_node import follow, node_fleet
from tests.workflows.burnin.test_server_burnin import resets
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import nodes_down_with_workload
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import budget_workflow_id
from workflows.firmware.firmware_update import FirmwareUpdate, FirmwareUpdateInput

BMC_IMAGE = "http://images.lab/bmc-25.03.bin"
BIOS_IMAGE = "http://images.lab/bios-1.9.0.bin"
BAD_IMAGE = "http://images.lab/bios-1.9.1-corrupt.bin"
IMAGES = {BMC_IMAGE: {"version": "25.03", "seconds": 0.5}, BIOS_IMAGE: {"version": "1.9.0", "seconds": 0.8},
          BAD_IMAGE: {"version": "1.9.1", "bad": "image signature does not verify"}}  # fmt: skip
BUNDLE = {"name": "hgx-h200-2026.12", "components": [
    {"name": "BIOS", "image_uri": BIOS_IMAGE, "version": "1.9.0", "order": 2, "activation": "reset"},
    {"name": "BMC", "image_uri": BMC_IMAGE, "version": "25.03", "order": 1, "activation": "none"},
]}  # fmt: skip


def update_input(bmcs, name: str, bundle: dict = BUNDLE, **fields) -> FirmwareUpdateInput:
    return FirmwareUpdateInput.model_validate({
        "server": {"name": name, "bmc": {"url": bmcs.bmc_urls[name]},
                   "kubernetes": {"cluster": "lab", "take_out_of_service": True,
                                  "drain": {"delete_emptydir_data": True, "eviction_retry_interval": 0.5}}},
        "bundle": bundle, **fields,
    })  # fmt: skip


async def start(client, queue: str, inp: FirmwareUpdateInput) -> WorkflowHandle:
    return await client.start_workflow(FirmwareUpdate.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                       task_queue=queue)  # fmt: skip


async def node_in_service(bmcs, admin, k8s, power_link) -> str:
    """A lab server that is a Kubernetes node in service, a trainer pod on it, the bundles' images served."""
    name = bmcs.names[6]
    await k8s.seed(node_fleet(name))
    await follow(power_link, admin, name)
    await admin.set_images(IMAGES)
    return name


async def updates_posted(admin, name: str) -> list[dict]:
    return [e["body"] for e in await admin.server_audit(name, writes=True) if e["path"].endswith("SimpleUpdate")]


async def test_a_node_in_service_is_taken_out_updated_verified_and_returned_then_a_rerun_changes_nothing(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = await node_in_service(burnin_bmcs, bmc_admin, k8s, power_link)
    await bmc_admin.config(bmc_restart_seconds=1.5)
    boot_before = (await core.read_node(name)).status.node_info.boot_id
    handle = await start(client, burnin_worker, update_input(burnin_bmcs, name))
    result = await handle.result()
    await record_history(handle, "firmware_update_node")
    assert BMC_PASSWORD not in (await handle.fetch_history()).to_json()  # a reference travels, never the secret

    assert result.result == "updated", result
    states = {c.name: (c.state, c.task_state, c.bmc_restarted) for c in result.components}
    assert states == {"BMC": ("active", "Completed", True), "BIOS": ("active", "Completed", False)}
    assert (result.versions["BMC"], result.versions["BIOS"]) == ("25.03", "1.9.0")
    assert [b["Targets"][0].rsplit("/", 1)[1] for b in await updates_posted(bmc_admin, name)] == ["BMC", "BIOS"]
    assert await resets(bmc_admin, name) == ["ForceRestart"]  # one reset, for the BIOS; the BMC restarted itself
    node = await core.read_node(name)
    assert not node.spec.unschedulable and "millwright.dev/cordoned-by" not in (node.metadata.annotations or {})
    assert node.status.node_info.boot_id != boot_before  # uncordoned once back from the reset, Ready
    assert await client.get_workflow_handle(budget_workflow_id("lab")).query(DisruptionBudget.leases) == []
    audit = await k8s.audit()
    assert nodes_down_with_workload(audit) == []  # the trainer was evicted before the reset
    leases = [e for e in audit if e.get("resource") == "nodes" and e["name"] == name
              and (e.get("nodeAfter") or {}).get("unschedulable")]  # fmt: skip
    assert leases, "the node was cordoned for the update"
    assert any("back in service" in n for n in result.notes), result.notes
    progress = await handle.query(FirmwareUpdate.progress)
    assert (progress.phase, progress.done, progress.total) == ("completed", 2, 2)

    cursor = await k8s.audit_cursor()
    again = await (await start(client, burnin_worker, update_input(burnin_bmcs, name))).result()
    assert again.result == "up-to-date" and {c.state for c in again.components} == {"at-target"}
    assert len(await updates_posted(bmc_admin, name)) == 2 and await resets(bmc_admin, name) == ["ForceRestart"]
    assert [e for e in await k8s.audit(since=cursor, writes=True) if e.get("resource") == "nodes"] == []


async def test_a_bad_image_stops_the_server_with_the_bmcs_message(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = await node_in_service(burnin_bmcs, bmc_admin, k8s, power_link)
    bundle = {"name": "bad", "components": [{"name": "BIOS", "image_uri": BAD_IMAGE, "version": "1.9.1"}]}
    handle = await start(client, burnin_worker, update_input(burnin_bmcs, name, bundle))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    assert cause.type == "FirmwareUpdateFailed" and "image signature does not verify" in cause.message, cause
    assert await resets(bmc_admin, name) == []
    assert (await bmc_admin.server(name))["firmware"]["BIOS"] == DEFAULT_FIRMWARE["BIOS"]
    node = await core.read_node(name)
    assert node.spec.unschedulable  # left out of service, with the reason
    assert "image signature does not verify" in json.loads(node.metadata.annotations[QUARANTINE_ANNOTATION])["reason"]
    assert await client.get_workflow_handle(budget_workflow_id("lab")).query(DisruptionBudget.leases) == []
    components = await handle.query(FirmwareUpdate.components)
    assert [(c.name, c.state, c.task_state) for c in components] == [("BIOS", "failed", "Exception")]


async def test_a_downgrade_is_refused_unless_allowed_and_cpld_waits_for_an_ac_power_cycle(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker
):
    name = burnin_bmcs.names[5]
    await bmc_admin.set_images({"http://images.lab/cpld-old.bin": {"version": "0.2.1.0"},
                                "http://images.lab/cpld.bin": {"version": "0.2.2.0"}})  # fmt: skip
    old = {"name": "old", "components": [{"name": "CPLD", "image_uri": "http://images.lab/cpld-old.bin",
                                          "version": "0.2.1.0", "activation": "ac_power_cycle"}]}  # fmt: skip
    data = update_input(burnin_bmcs, name, old).model_dump(mode="json")
    data["server"]["kubernetes"] = None
    with pytest.raises(WorkflowFailureError) as failed:
        await (await start(client, burnin_worker, FirmwareUpdateInput.model_validate(data))).result()
    assert failed.value.cause.type == "FirmwareDowngradeRefused" and "allow_downgrade" in failed.value.cause.message
    assert await updates_posted(bmc_admin, name) == []

    data["bundle"]["components"][0].update(image_uri="http://images.lab/cpld.bin", version="0.2.2.0")
    result = await (await start(client, burnin_worker, FirmwareUpdateInput.model_validate(data))).result()
    assert result.versions["CPLD"] == "0.2.2.0" and (await bmc_admin.server(name))["ac_cycles"] == 1


async def requested(handle: WorkflowHandle) -> list[str]:
    """What the run asked of activities and other workflows (a lease, a cordon, a BMC write), in order."""
    asked = []
    for e in (await handle.fetch_history()).events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            asked.append(e.activity_task_scheduled_event_attributes.activity_type.name)
        elif e.HasField("signal_external_workflow_execution_initiated_event_attributes"):
            asked.append("signal " + e.signal_external_workflow_execution_initiated_event_attributes.signal_name)
        elif e.HasField("start_child_workflow_execution_initiated_event_attributes"):
            asked.append("child " + e.start_child_workflow_execution_initiated_event_attributes.workflow_type.name)
    return asked


async def test_a_downgrade_is_refused_before_the_node_is_leased_or_cordoned(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    name = await node_in_service(burnin_bmcs, bmc_admin, k8s, power_link)
    await bmc_admin.set_images({"http://images.lab/cpld-old.bin": {"version": "0.2.1.0"}})
    old = {"name": "old", "components": [{"name": "CPLD", "image_uri": "http://images.lab/cpld-old.bin",
                                          "version": "0.2.1.0", "activation": "ac_power_cycle"}]}  # fmt: skip
    cursor = await k8s.audit_cursor()
    handle = await start(client, burnin_worker, update_input(burnin_bmcs, name, old))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    await record_history(handle, "firmware_update_downgrade_refused")
    assert failed.value.cause.type == "FirmwareDowngradeRefused" and "allow_downgrade" in failed.value.cause.message
    assert await requested(handle) == ["firmware_inventory"]  # no lease asked, nothing written
    assert [e for e in await k8s.audit(since=cursor, writes=True) if e.get("resource") == "nodes"] == []
    node = await core.read_node(name)
    assert not node.spec.unschedulable and QUARANTINE_ANNOTATION not in (node.metadata.annotations or {})
    assert await updates_posted(bmc_admin, name) == []


async def test_a_bmc_that_is_not_the_nodes_machine_is_refused_before_any_write(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    """The input names one server's BMC and another server's node: the BMC's system UUID is not the node's."""
    name = await node_in_service(burnin_bmcs, bmc_admin, k8s, power_link)
    data = update_input(burnin_bmcs, name).model_dump(mode="json")
    data["server"]["kubernetes"]["node"] = "spare"
    writes_before = len(await bmc_admin.server_audit(name, writes=True))
    cursor = await k8s.audit_cursor()
    handle = await start(client, burnin_worker, FirmwareUpdateInput.model_validate(data))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    await record_history(handle, "firmware_update_identity_mismatch")
    cause = failed.value.cause
    bmc_uuid = normalize_spec(name)["uuid"]  # the lab BMC's ComputerSystem.UUID
    node_uuid = (await core.read_node("spare")).status.node_info.system_uuid
    assert cause.type == "ServerIdentityMismatch" and cause.non_retryable, cause
    assert all(w in cause.message for w in (f"server {name}", "node spare", bmc_uuid, node_uuid)), cause.message
    assert [e for e in await k8s.audit(since=cursor, writes=True) if e.get("resource") == "nodes"] == []
    assert len(await bmc_admin.server_audit(name, writes=True)) == writes_before  # no BMC write
    assert "signal" not in " ".join(await requested(handle))  # no lease asked


def test_the_example_input_is_valid():
    example = json.loads((Path(__file__).parents[3] / "examples" / "firmware-update.json").read_text())
    example["server"]["bmc"]["url"] = "https://127.0.0.1:1"  # what `lab up` writes in
    inp = FirmwareUpdateInput.model_validate(example)
    assert inp.server.kubernetes is not None and inp.server.kubernetes.take_out_of_service


@pytest_asyncio.fixture(loop_scope="session")
async def image_server():
    """An image server the worker reaches (a pushed image is fetched by the worker, not the BMC): path -> bytes."""
    images: dict[str, bytes] = {}

    async def serve(request: web.Request) -> web.Response:
        found = images.get(request.path)
        return web.Response(body=found, content_type="application/octet-stream") if found else web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{tail:.*}", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", images
    await runner.cleanup()


async def test_an_image_is_pushed_where_the_bmc_offers_multipart_and_pulled_where_it_does_not(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, image_server
):
    url, images = image_server
    images["/bios-1.9.0.bin"] = b"\x7fBIOS" * 1000
    await bmc_admin.set_images({f"{url}/bios-1.9.0.bin": {"version": "1.9.0", "seconds": 0.3}})
    bundle = {"name": "pushed", "components": [{"name": "BIOS", "image_uri": f"{url}/bios-1.9.0.bin",
                                                 "version": "1.9.0", "push": True}]}  # fmt: skip
    pushed_to, pulled_by = burnin_bmcs.names[3], burnin_bmcs.names[4]

    def bare(name: str) -> FirmwareUpdateInput:
        data = update_input(burnin_bmcs, name, bundle).model_dump(mode="json")
        data["server"]["kubernetes"] = None
        return FirmwareUpdateInput.model_validate(data)

    result = await (await start(client, burnin_worker, bare(pushed_to))).result()
    assert result.versions["BIOS"] == "1.9.0" and [c.pushed for c in result.components] == [True], result
    writes = await bmc_admin.server_audit(pushed_to, writes=True)
    [push] = [e for e in writes if e["path"].endswith("/UpdateService/update-multipart")]
    assert push["body"]["UpdateParameters"]["Targets"] == ["/redfish/v1/UpdateService/FirmwareInventory/BIOS"]
    assert push["body"]["UpdateFile"] == {"filename": "bios-1.9.0.bin", "bytes": 5000}
    assert await updates_posted(bmc_admin, pushed_to) == []  # no SimpleUpdate

    await bmc_admin.config(multipart_push=0)  # a BMC without MultipartHttpPushUri: it pulls the URI itself
    result = await (await start(client, burnin_worker, bare(pulled_by))).result()
    assert result.versions["BIOS"] == "1.9.0" and [c.pushed for c in result.components] == [False], result
    assert [b["ImageURI"] for b in await updates_posted(bmc_admin, pulled_by)] == [f"{url}/bios-1.9.0.bin"]
