"""The firmware activities (activities/firmware/) against the lab BMCs: what a retried attempt does, a BMC that
restarts while its task is followed, and version ordering."""

from __future__ import annotations

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.firmware.activities import FirmwareActivities
from activities.firmware.models import Activation, TaskFollow, UpdateStart
from activities.firmware.versions import is_downgrade
from activities.support.secrets import SecretRef
from lab.bmc import DEFAULT_FIRMWARE
from tests.activities.redfish.conftest import BMC_PASSWORD, BMC_USER
from tests.activities.redfish.test_lab_bmc import until
from tests.activities.redfish.test_redfish_activities import bmc, resets

BIOS = "http://images.lab/bios-1.9.0.bin"


@pytest.fixture
def acts(bmc_secret_file) -> FirmwareActivities:
    return FirmwareActivities(SecretRef.parse(f"file:{bmc_secret_file}"))


async def test_a_retried_start_follows_the_running_task_and_a_retried_activation_does_not_reset_again(
    acts, lab_bmcs, bmc_admin
):
    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 0), lab_bmcs.names[0]
    await bmc_admin.set_images({BIOS: {"version": "1.9.0", "seconds": 1.0}})
    start = UpdateStart(bmc=ref, targets=["BIOS"], image_uri=BIOS, version="1.9.0")
    first = await env.run(acts.start_firmware_update, start)
    again = await env.run(acts.start_firmware_update, start)  # an attempt whose answer was lost, retried
    assert first.outcome == again.outcome == "started" and first.task == again.task and first.task
    assert first.installed == {"BIOS": DEFAULT_FIRMWARE["BIOS"]}
    outcome = await env.run(acts.follow_firmware_task, TaskFollow(bmc=ref, task=first.task, targets=["BIOS"],
                                                                  version="1.9.0"))  # fmt: skip
    assert (outcome.state, outcome.active, outcome.bmc_restarted) == ("Completed", False, False)
    activate = Activation(bmc=ref, how="reset", want={"BIOS": "1.9.0"})
    assert (await env.run(acts.activate_firmware, activate)).reset is True
    assert (await env.run(acts.activate_firmware, activate)).reset is False
    assert await resets(bmc_admin, name) == ["On"]  # the server was off: one power-on boots the new BIOS
    assert (await env.run(acts.start_firmware_update, start)).outcome == "at-target"


async def test_a_start_retried_after_its_task_completed_awaiting_activation_follows_it_and_flashes_once(
    acts, lab_bmcs, bmc_admin
):
    """The worker died right after the BMC accepted the SimpleUpdate; its task then completed with the image staged
    (the inventory still shows the old version): the retried start follows that task to activation."""
    env, ref, name = ActivityEnvironment(), bmc(lab_bmcs, 0), lab_bmcs.names[0]
    image = "http://images.lab/bios-1.9.5-retried.bin"
    await bmc_admin.set_images({image: {"version": "1.9.5", "seconds": 0.3}})
    start = UpdateStart(bmc=ref, targets=["BIOS"], image_uri=image, version="1.9.5")
    first = await env.run(acts.start_firmware_update, start)
    assert first.task
    outcome = await env.run(acts.follow_firmware_task, TaskFollow(bmc=ref, task=first.task, targets=["BIOS"],
                                                                  version="1.9.5"))  # fmt: skip
    assert (outcome.state, outcome.active) == ("Completed", False)  # staged, awaiting a reset

    again = await env.run(acts.start_firmware_update, start)  # the start's answer was lost: retried
    assert (again.outcome, again.task) == ("started", first.task)
    posted = [e for e in await bmc_admin.server_audit(name, writes=True)
              if e["path"].endswith("SimpleUpdate") and e["body"]["ImageURI"] == image]  # fmt: skip
    assert len(posted) == 1, posted
    await env.run(acts.activate_firmware, Activation(bmc=ref, how="reset", want={"BIOS": "1.9.5"}))
    assert (await env.run(acts.start_firmware_update, start)).outcome == "at-target"


async def test_following_a_task_waits_out_the_bmc_restart_and_failures_carry_the_bmcs_message(
    acts, lab_bmcs, bmc_admin
):
    env, ref = ActivityEnvironment(), bmc(lab_bmcs, 1)
    beats: list = []
    env.on_heartbeat = lambda *details: beats.append(details[0])
    await bmc_admin.config(bmc_restart_seconds=1.5)
    await bmc_admin.set_images({"http://images.lab/bmc.bin": {"version": "25.03", "seconds": 0.3},
                                "http://images.lab/bad.bin": {"version": "1.9.9", "bad": "corrupt header"}})  # fmt: skip
    started = await env.run(acts.start_firmware_update, UpdateStart(
        bmc=ref, targets=["BMC"], image_uri="http://images.lab/bmc.bin", version="25.03"))  # fmt: skip
    outcome = await env.run(acts.follow_firmware_task, TaskFollow(bmc=ref, task=started.task, targets=["BMC"],
                                                                  version="25.03"))  # fmt: skip
    assert (outcome.state, outcome.active, outcome.bmc_restarted) == ("Completed", True, True)
    assert any(b.get("state") == "BmcRestarting" for b in beats), beats
    assert all(BMC_PASSWORD not in str(b) for b in beats)

    bad = await env.run(acts.start_firmware_update, UpdateStart(
        bmc=ref, targets=["BIOS"], image_uri="http://images.lab/bad.bin", version="1.9.9"))  # fmt: skip
    with pytest.raises(ApplicationError) as failed:
        await env.run(acts.follow_firmware_task, TaskFollow(bmc=ref, task=bad.task, targets=["BIOS"],
                                                            version="1.9.9"))  # fmt: skip
    assert failed.value.type == "FirmwareUpdateFailed" and failed.value.non_retryable
    assert "corrupt header" in failed.value.message and BMC_PASSWORD not in failed.value.message
    with pytest.raises(ApplicationError) as unknown:
        await env.run(acts.start_firmware_update, UpdateStart(
            bmc=ref, targets=["NIC9"], image_uri="http://images.lab/bad.bin", version="1"))  # fmt: skip
    assert unknown.value.type == "FirmwareComponentUnknown" and unknown.value.non_retryable


async def test_a_finished_update_whose_monitor_answered_204_then_404_is_followed_from_its_task(
    acts, lab_bmcs, bmc_admin
):
    """OpenBMC's bmcweb: a task's monitor answers 202 while it runs, 204 once it ended, then 404; the Task stays."""
    env, ref = ActivityEnvironment(), bmc(lab_bmcs, 2)
    await bmc_admin.config(monitor_expires=1)
    await bmc_admin.set_images({BIOS: {"version": "1.9.0", "seconds": 0.5}})
    started = await env.run(acts.start_firmware_update, UpdateStart(bmc=ref, targets=["BIOS"], image_uri=BIOS,
                                                                    version="1.9.0"))  # fmt: skip
    monitor = f"{started.task}/Monitor"
    with httpx.Client(base_url=ref.url, auth=(BMC_USER, BMC_PASSWORD)) as c:
        assert c.get(monitor).status_code == 202
        await until(lambda: c.get(monitor).status_code == 204, what="the monitor's 204")
        assert c.get(monitor).status_code == 404
        assert c.get(started.task).json()["TaskState"] == "Completed"
    outcome = await env.run(acts.follow_firmware_task, TaskFollow(bmc=ref, task=started.task, targets=["BIOS"],
                                                                  version="1.9.0"))  # fmt: skip
    assert (outcome.state, outcome.active) == ("Completed", False)  # BIOS activates at the next boot


async def test_a_bad_flash_on_one_server_is_caught_when_its_version_does_not_activate(acts, lab_bmcs, bmc_admin):
    """The same image on two servers; one's flash is written bad: its task completes, but after the reset it runs
    the previous BIOS (its SEL says why), and the activation fails on that server only."""
    env, good, bad = ActivityEnvironment(), bmc(lab_bmcs, 0), bmc(lab_bmcs, 3)
    await bmc_admin.set_images({BIOS: {"version": "1.9.0", "seconds": 0.2}})
    await bmc_admin.set_bad_flash(lab_bmcs.names[3], {"BIOS": "image CRC mismatch in flash bank B"})
    for ref in (good, bad):
        started = await env.run(acts.start_firmware_update, UpdateStart(bmc=ref, targets=["BIOS"], image_uri=BIOS,
                                                                        version="1.9.0"))  # fmt: skip
        followed = await env.run(acts.follow_firmware_task, TaskFollow(bmc=ref, task=started.task, targets=["BIOS"],
                                                                       version="1.9.0"))  # fmt: skip
        assert followed.state == "Completed"
    activation = Activation(bmc=good, how="reset", want={"BIOS": "1.9.0"}, timeout_seconds=3)
    assert (await env.run(acts.activate_firmware, activation)).versions == {"BIOS": "1.9.0"}
    with pytest.raises(ApplicationError) as failed:
        await env.run(acts.activate_firmware, activation.model_copy(update={"bmc": bad}))
    assert failed.value.type == "FirmwareNotActivated" and failed.value.non_retryable
    assert f"BIOS {DEFAULT_FIRMWARE['BIOS']}" in failed.value.message
    view = await bmc_admin.server(lab_bmcs.names[3])
    assert view["bad_flash"] == {} and "CRC mismatch" in view["sel"][-1]["Message"]  # used once; the SEL says why


@pytest.mark.parametrize(("installed", "wanted", "downgrade"), [
    ("24.09", "25.03", False), ("25.03", "24.09", True), ("1.8.2", "1.8.10", False), ("1.8.2", "1.8", True),
    ("96.00.A5.00.01", "96.00.B0.00.01", False), ("96.00.B0.00.01", "96.00.A5.00.01", True),
    ("0.2.1.9", "0.2.1.9", False),
])  # fmt: skip
def test_versions_order_by_parts(installed: str, wanted: str, downgrade: bool) -> None:
    assert is_downgrade(installed, wanted) is downgrade
