"""The lab BMC (lab/redfish.py) against DMTF's own Redfish Service Validator (`rf_service_validator`, PyPI
`redfish-service-validator`), every resource it reaches from the service root checked against DSP8010's CSDL: the
UpdateService, its FirmwareInventory and a firmware update's Task included, and the chassis of an NVL72 compute tray
and switch tray (lab/bmc_trays.py). No failure may be reported."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.activities.redfish.conftest import BMC_PASSWORD, BMC_USER
from tests.activities.redfish.test_lab_bmc import until

SCHEMAS = Path(__file__).parent / "csdl"
VALIDATOR = Path(sys.executable).parent / "rf_service_validator"
BIOS_IMAGE = "http://images.lab/bios-1.9.0.bin"


async def test_the_lab_bmc_passes_the_dmtf_service_validator(lab_bmcs, bmc_admin, tmp_path):
    name = lab_bmcs.names[1]
    url = lab_bmcs.bmc_urls[name]
    await bmc_admin.set_images({BIOS_IMAGE: {"version": "1.9.0", "seconds": 0.2}})
    with httpx.Client(base_url=url, auth=(BMC_USER, BMC_PASSWORD)) as bmc:
        started = bmc.post("/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
                           json={"ImageURI": BIOS_IMAGE, "TransferProtocol": "HTTP",
                                 "Targets": ["/redfish/v1/UpdateService/FirmwareInventory/BIOS"]})  # fmt: skip
        assert started.status_code == 202, started.text
        task = started.json()["@odata.id"]
        await until(lambda: bmc.get(task).json()["TaskState"] == "Completed")

    validated, passed = validate(url, tmp_path)
    assert {
        "/redfish/v1/UpdateService",
        "/redfish/v1/UpdateService/FirmwareInventory/BIOS",
        task,
        "/redfish/v1/TaskService",
        "/redfish/v1/Systems/1",
        "/redfish/v1/Managers/1",
    } <= validated
    assert passed > 500


def test_the_nvl72_trays_bmcs_pass_the_dmtf_service_validator(tmp_path):
    from lab.nvl72 import Nvl72Fleet
    from lab.redfish import LabBmcs

    specs = Nvl72Fleet(racks=1).bmc_specs()
    compute, switch = specs[14], specs[18]
    with LabBmcs(servers=[compute, switch], user=BMC_USER, password=BMC_PASSWORD) as bmcs:
        validated, _ = validate(bmcs.bmc_urls[compute["name"]], tmp_path / "compute")
        assert {"/redfish/v1/Chassis/1", "/redfish/v1/Chassis/CBC_0"} <= validated
        validated, _ = validate(bmcs.bmc_urls[switch["name"]], tmp_path / "switch")
        assert {"/redfish/v1/Chassis/1", "/redfish/v1/Chassis/MGX_NVSwitch_0", "/redfish/v1/Systems/1"} <= validated


def validate(url: str, logdir: Path) -> tuple[set[str], int]:
    """The validator's run on the BMC at `url`: the resources it validated and how many checks passed; none may
    fail, and every schema must be found."""
    run = subprocess.run(
        [str(VALIDATOR), "--rhost", url, "--user", BMC_USER, "--password", BMC_PASSWORD, "--authtype", "Basic",
         "--schema_directory", str(SCHEMAS), "--skipschema", "--logdir", str(logdir)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = run.stdout + run.stderr
    counts = re.search(r"\|\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|", out)
    assert counts, out[-3000:]
    passed, _, failed, _ = map(int, counts.groups())
    assert run.returncode == 0 and failed == 0, out[-3000:]
    assert "schema not found" not in out.lower() and "no schema" not in out.lower(), out[-3000:]
    return set(re.findall(r"^Validating (\S+)\.\.\.$", out, re.MULTILINE)), passed
