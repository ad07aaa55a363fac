"""FirmwareCampaign across two small clusters (two Kubernetes emulators: conftest.py) whose nodes are lab servers with
lab BMCs (tests/workflows/burnin/conftest.py), on a real dev server: the canary cluster's FleetFirmwareUpdate, paused
and resumed through the campaign (`millwright campaign pause|resume NAME`, the child's run held by the campaign's
signals), then the wave's; each cluster's servers taken out of service in their own cluster only."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pydantic
import pytest
import pytest_asyncio

from lab.fleet import Fleet
from lab.k8s.admin import EmulatorAdmin
from tests.cli_in_process import cli
from tests.kube_helpers import declare_lab_budget, wait_for
from tests.workflows.firmware.test_firmware_update import BMC_IMAGE, updates_posted
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.campaign.firmware_campaign import FirmwareCampaign, FirmwareCampaignInput
from workflows.firmware.fleet import CAMPAIGN_PAUSE, FleetFirmwareStatus

CLUSTERS = ["east", "west"]  # the emulators (conftest.py)
BMC_ONLY = {"name": "bmc-25.03", "components": [{"name": "BMC", "image_uri": BMC_IMAGE, "version": "25.03"}]}


@pytest_asyncio.fixture(loop_scope="session")
async def labs(emulators, client, campaign_worker, burnin_bmcs, bmc_admin):
    """Each cluster emptied, then two of the lab's servers as its nodes (powered on), its budget declared; the BMC
    image takes 3 s to flash, so a pause lands while the canary's fleet runs. Cluster -> (its admin, its servers)."""
    servers = dict(zip(CLUSTERS, (burnin_bmcs.names[0:2], burnin_bmcs.names[2:4]), strict=True))
    admins = {c: EmulatorAdmin(e.url) for c, e in emulators.items()}
    for cluster, admin in admins.items():
        await admin.reset()
        nodes = [{"name": n, "gpus": 8} for n in servers[cluster]]
        await admin.seed(Fleet.model_validate({"cluster": cluster, "workloads": [], "nodes": nodes}).to_objects())
        await declare_lab_budget(client, campaign_worker.task_queue, cluster=cluster)
        for name in servers[cluster]:
            await bmc_admin.power(name, "On")
    await bmc_admin.set_images({BMC_IMAGE: {"version": "25.03", "seconds": 3}})
    await bmc_admin.config(bmc_restart_seconds=0.5)
    yield {c: (admins[c], servers[c]) for c in CLUSTERS}
    for admin in admins.values():
        await admin.aclose()


def campaign(bmcs, servers: dict[str, list[str]]) -> FirmwareCampaignInput:
    tag = uuid.uuid4().hex[:6]
    firmware = {
        "name": f"bmc-{tag}", "bundle": BMC_ONLY, "waves": {"canary": 1, "batch_sizes": [1]}, "max_concurrent_bmcs": 1,
        "servers": {c: [{"name": n, "bmc": {"url": bmcs.bmc_urls[n]}} for n in names] for c, names in servers.items()},
        "kubernetes": {"take_out_of_service": True, "drain": {"eviction_retry_interval": 0.2}},
    }  # fmt: skip
    plan = {"canary": "west", "soak": "PT1S"}
    return FirmwareCampaignInput.model_validate({"name": f"bmc-{tag}", "clusters": CLUSTERS, "firmware": firmware,
                                                 "plan": plan})  # fmt: skip


@pytest.mark.parametrize(("firmware", "refused"), [
    ({"servers": {"east": [{"name": "a"}]}}, "firmware.servers: no servers for west"),
    ({"servers": {"east": [{"name": "a"}], "west": [{"name": "b"}], "north": [{"name": "c"}]}},
     "firmware.servers: north not in clusters"),
    ({"servers": {"east": [{"name": "a"}], "west": [{"name": "a"}]}}, "servers listed in two clusters: a"),
    ({"servers": {"east": [{"name": "a", "kubernetes": {"cluster": "west"}}], "west": [{"name": "b"}]}},
     "servers.east[0].kubernetes.cluster: 'west', not 'east'"),
    # Each cluster's fleet input, checked at the start as the fleet checks its own: its name, a node's validation.
    ({"name": "x" * 60}, "firmware for cluster 'east': name: String should have at most 63 characters"),
    ({"validation": {"expected_gpus": 8}}, "firmware for cluster 'east': Value error, validation gates a node's "
     "return to service: servers[0].kubernetes needs take_out_of_service"),
])  # fmt: skip
def test_each_cluster_has_its_own_servers_and_a_valid_fleet_input(firmware, refused):
    good = {"name": "bmc", "bundle": BMC_ONLY, "record_in_netbox": True,
            "servers": {"east": [{"name": "a"}], "west": [{"name": "b"}]}}  # fmt: skip
    FirmwareCampaignInput.model_validate({"name": "bmc", "clusters": CLUSTERS, "firmware": good})
    with pytest.raises(pydantic.ValidationError, match=re.escape(refused)):
        FirmwareCampaignInput.model_validate({"name": "bmc", "clusters": CLUSTERS, "firmware": good | firmware})


async def test_canary_cluster_paused_and_resumed_then_the_wave_each_cluster_its_own_fleet(
    client, campaign_worker, labs, burnin_bmcs, bmc_admin, temporal_address
):
    inp = campaign(burnin_bmcs, {c: servers for c, (_, servers) in labs.items()})
    handle = await client.start_workflow(
        FirmwareCampaign.run, inp, id=inp.workflow_id(), task_queue=campaign_worker.task_queue
    )
    fleet = client.get_workflow_handle(f"fleet-firmware-update/{inp.firmware.name}.west")

    async def canary_flashing():
        try:
            s = await fleet.query("status", result_type=FleetFirmwareStatus)
        except Exception:  # not started yet
            return None
        return s if any(x.state == "running" for x in s.servers) else None

    await wait_for(canary_flashing, what="the canary cluster's first server flashing", timeout=60)
    paused = await cli("campaign", "pause", inp.name, "--by", "alice", "--reason", "watching the canary",
                       "--address", temporal_address)  # fmt: skip
    assert paused.returncode == 0, paused.stderr

    async def fleet_held():
        s = await fleet.query("status", result_type=FleetFirmwareStatus)
        return s if s.paused and not any(x.state == "running" for x in s.servers) else None

    held = await wait_for(fleet_held, what="the canary's fleet paused by the campaign", timeout=60)
    assert held.paused.startswith(CAMPAIGN_PAUSE) and [x.state for x in held.servers] == ["updated", "pending"], held
    status = await handle.query(FirmwareCampaign.status)
    assert status.phase == "paused" and status.clusters["east"].state == "pending", status
    listed = await cli("ls", "--family", "FirmwareCampaign", "--address", temporal_address)
    assert "west=running east=pending" in listed.stdout, listed.stdout
    resumed = await cli("campaign", "resume", inp.name, "--by", "alice", "--reason", "canary fine",
                        "--address", temporal_address)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    result = await handle.result()

    assert result.outcome == "completed" and result.waves == [["west"], ["east"]], result
    west, east = result.clusters["west"], result.clusters["east"]
    assert all(o.state == "completed" and o.counts == {"updated": 2} for o in (west, east)), result
    assert east.started - west.ended >= timedelta(seconds=1), result  # after the canary's soak
    decisions = (await fleet.query("status", result_type=FleetFirmwareStatus)).decisions
    assert decisions == [
        "pause (campaign): watching the canary (by alice)",
        "resume (campaign): canary fine (by alice)",
    ]
    for cluster, (admin, servers) in labs.items():
        # Each cluster's child is the FleetFirmwareUpdate the CLI would start, over its own servers and nodes only.
        assert result.clusters[cluster].workflow_id == f"fleet-firmware-update/{inp.firmware.name}.{cluster}"
        child = await client.get_workflow_handle(result.clusters[cluster].workflow_id).describe()
        assert child.workflow_type == "FleetFirmwareUpdate" and child.task_queue == campaign_worker.task_queue
        cordoned = {e["name"] for e in await admin.audit(writes=True)
                    if e.get("resource") == "nodes" and e.get("userAgent", "").startswith("millwright")}  # fmt: skip
        assert cordoned == set(servers), (cluster, cordoned)
        assert [len(await updates_posted(bmc_admin, n)) for n in servers] == [1, 1], cluster
    shown = await cli("status", handle.id, "--address", temporal_address)
    run = rf"fleet-firmware-update/{inp.firmware.name}\.west"
    assert re.search(rf"west +0 +completed +{run} +updated=2", shown.stdout), shown.stdout
    await record_history(handle, "firmware_campaign")
    await record_history(fleet, "fleet_firmware_update_paused_by_campaign")
