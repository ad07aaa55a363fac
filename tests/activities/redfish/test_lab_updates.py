"""The lab BMC's UpdateService, TaskService and FirmwareInventory (lab/bmc_update.py), through the real sushy client
where sushy covers it (SimpleUpdate, its TaskMonitor) and plain HTTP where it does not (Chassis.Reset)."""

from __future__ import annotations

import time

import httpx
import sushy

from lab.bmc import DEFAULT_FIRMWARE
from tests.activities.redfish.test_lab_bmc import AUTH, until

FW = "/redfish/v1/UpdateService/FirmwareInventory"
BIOS_IMAGE = "http://images.lab/bios-1.9.0.bin"


def task(url: str, monitor: str) -> dict:
    with httpx.Client(base_url=url, auth=AUTH) as c:
        return c.get(monitor.removesuffix("/Monitor")).json()


def version(url: str, component: str) -> str:
    with httpx.Client(base_url=url, auth=AUTH) as c:
        return c.get(f"{FW}/{component}").json()["Version"]


async def test_simple_update_runs_a_task_and_the_version_activates_at_the_next_boot(lab_bmcs, bmc_admin, redfish):
    name = lab_bmcs.names[0]
    url = lab_bmcs.bmc_urls[name]
    await bmc_admin.set_images({BIOS_IMAGE: {"version": "1.9.0", "seconds": 0.6}})
    root = redfish(name)
    updates = root.get_update_service()
    monitor = updates.simple_update(BIOS_IMAGE, targets=[f"{FW}/BIOS"], transfer_protocol="HTTP")
    assert monitor.is_processing  # sushy follows the Task's own URI (the body's @odata.id), not the monitor
    running = task(url, monitor.task_monitor_uri)
    assert running["TaskState"] == "Running" and 0 <= running["PercentComplete"] < 100 and "EndTime" not in running
    # The Task resource answers 200 while it runs (only its monitor answers 202), so sushy's wait() cannot wait on it.
    done = await until(lambda: (t := task(url, monitor.task_monitor_uri))["TaskState"] != "Running" and t)
    assert (done["TaskState"], done["TaskStatus"], done["PercentComplete"]) == ("Completed", "OK", 100)
    assert done["Messages"][-1]["MessageId"] == "Update.1.0.AwaitToActivate"
    assert version(url, "BIOS") == DEFAULT_FIRMWARE["BIOS"]  # not yet: it waits for a reset
    assert (await bmc_admin.server(name))["firmware_pending"] == {"BIOS": {"version": "1.9.0", "apply": "reset"}}
    root.get_system("/redfish/v1/Systems/1").reset_system(sushy.RESET_ON)
    await bmc_admin.wait_power(name, "On", min_boots=1)
    assert version(url, "BIOS") == "1.9.0"
    assert root.get_system("/redfish/v1/Systems/1").bios_version == "1.9.0"


async def test_bad_image_missing_image_and_armed_fault_end_in_exception_keeping_the_version(lab_bmcs, bmc_admin):
    name = lab_bmcs.names[1]
    url = lab_bmcs.bmc_urls[name]
    await bmc_admin.config(update_seconds=0.1)
    await bmc_admin.set_images({"http://images.lab/bad.bin": {"version": "9.9", "bad": "signature mismatch"},
                                "http://images.lab/gpu.bin": {"version": "96.00.B0.00.01"}})  # fmt: skip
    await bmc_admin.set_update_faults(name, {"GPU0": "flash write error at 0x4000"})
    cases = [("http://images.lab/bad.bin", "BIOS", "VerificationFailed", "signature mismatch"),
             ("http://images.lab/missing.bin", "BIOS", "TransferFailed", "404"),
             ("http://images.lab/gpu.bin", "GPU0", "ApplyFailed", "flash write error")]  # fmt: skip
    with httpx.Client(base_url=url, auth=AUTH) as c:
        for image, target, message_id, text in cases:
            r = c.post("/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
                       json={"ImageURI": image, "Targets": [f"{FW}/{target}"]})  # fmt: skip
            assert r.status_code == 202, r.text
            monitor = r.headers["Location"]
            t = await until(lambda m=monitor: c.get(m).status_code == 200 and c.get(m).json(), what="task end")
            assert (t["TaskState"], t["TaskStatus"]) == ("Exception", "Critical")
            assert t["Messages"][-1]["MessageId"] == f"Update.1.0.{message_id}" and text in t["Messages"][-1]["Message"]
            assert "EndTime" in t and version(url, target) == DEFAULT_FIRMWARE[target]
        assert (await bmc_admin.server(name))["update_faults"] == {}  # used once


async def test_bmc_update_restarts_the_bmc_and_cpld_waits_for_an_ac_power_cycle(lab_bmcs, bmc_admin):
    name = lab_bmcs.names[2]
    url = lab_bmcs.bmc_urls[name]
    await bmc_admin.config(update_seconds=0.1, bmc_restart_seconds=1.0)
    await bmc_admin.set_images({"http://images.lab/bmc.bin": {"version": "25.03"},
                                "http://images.lab/cpld.bin": {"version": "0.2.2.0"}})  # fmt: skip
    with httpx.Client(base_url=url, auth=AUTH, timeout=2) as c:
        r = c.post("/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
                   json={"ImageURI": "http://images.lab/bmc.bin", "Targets": [f"{FW}/BMC"]})  # fmt: skip
        monitor = r.headers["Location"]
        assert r.status_code == 202

        def gone() -> bool:
            try:
                c.get("/redfish/v1/")
            except httpx.TransportError:
                return True
            return False

        await until(gone, what="the BMC restarting")
        started = time.monotonic()
        await until(lambda: not gone(), timeout=5, what="the BMC back")
        assert time.monotonic() - started > 0.3
        assert c.get(monitor).status_code == 404  # the task lived in the old BMC's memory
        assert version(url, "BMC") == "25.03" and c.get("/redfish/v1/Managers/1").json()["FirmwareVersion"] == "25.03"

        r = c.post("/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
                   json={"ImageURI": "http://images.lab/cpld.bin", "Targets": [f"{FW}/CPLD"]})  # fmt: skip
        await until(lambda: c.get(r.headers["Location"]).status_code == 200, what="task end")
        c.post("/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", json={"ResetType": "On"})
        await bmc_admin.wait_power(name, "On", min_boots=1)
        assert version(url, "CPLD") == DEFAULT_FIRMWARE["CPLD"]  # a host reset is not enough
        assert c.post("/redfish/v1/Chassis/1/Actions/Chassis.Reset", json={"ResetType": "On"}).status_code == 400
        assert (
            c.post("/redfish/v1/Chassis/1/Actions/Chassis.Reset", json={"ResetType": "PowerCycle"}).status_code == 204
        )
        assert version(url, "CPLD") == "0.2.2.0"
        await bmc_admin.wait_power(name, "On", min_boots=2)  # the running system came back
        assert (await bmc_admin.server(name))["ac_cycles"] == 1


async def test_simple_update_refuses_what_it_cannot_do(lab_bmcs, bmc_admin, redfish):
    name = lab_bmcs.names[3]
    updates = redfish(name).get_update_service()
    assert updates.http_push_uri is None and updates.service_enabled
    with httpx.Client(base_url=lab_bmcs.bmc_urls[name], auth=AUTH) as c:
        action = "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"
        for body, wrong in (({"Targets": [f"{FW}/BIOS"]}, "ImageURI"), ({"ImageURI": "http://i/x"}, "Targets"),
                            ({"ImageURI": "http://i/x", "Targets": [f"{FW}/NIC9"]}, "Targets"),
                            ({"ImageURI": "ftp://i/x", "Targets": [f"{FW}/BIOS"]}, "TransferProtocol"),
                            ({"ImageURI": "http://i/x", "Targets": [f"{FW}/BIOS"],
                              "@Redfish.OperationApplyTime": "Later"}, "OperationApplyTime")):  # fmt: skip
            r = c.post(action, json=body)
            assert r.status_code == 400 and wrong in r.json()["error"]["message"], (body, r.text)
        root = c.get("/redfish/v1/").json()
        assert c.get(root["Tasks"]["@odata.id"]).json()["Tasks"]["@odata.id"] == "/redfish/v1/TaskService/Tasks"
