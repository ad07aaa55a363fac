"""gpu_verdict: each fault gives the right finding, a healthy host passes, before/after growth is judged."""

from __future__ import annotations

import pytest

from activities.gpu.dcgm import parse_dcgm_json
from activities.gpu.models import (
    THROTTLE_GPU_IDLE,
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    DcgmDiag,
    DcgmTestResult,
    GpuCheckRequest,
    GpuCheckResult,
    GpuLoadStats,
    HostGpuSnapshot,
    NvlinkErrors,
    StressResult,
    XidEvent,
    throttle_names,
)
from activities.gpu.verdict import gpu_verdict
from lab.gpus import SimulatedGpuProbe

H200 = GpuCheckRequest(expected_count=8, expected_model="H200")


async def snap(faults: dict | None = None) -> HostGpuSnapshot:
    return await SimulatedGpuProbe({"name": "n1"}, faults).snapshot()


def healthy_stress(**kw) -> StressResult:
    gpus = [GpuLoadStats(gpu=i, samples=5, max_temperature_c=70, max_power_w=650, max_pcie_gen=5) for i in range(8)]
    return StressResult(**{"seconds": 5, "elapsed": 5, "tool": "gpu_burn 5", "gpus": gpus, **kw})


def checks(verdict, severity: str | None = None) -> set[tuple]:
    return {(f.gpu, f.check) for f in verdict.findings if severity is None or f.severity == severity}


def edit(s: HostGpuSnapshot, gpu: int, **changes) -> HostGpuSnapshot:
    s = s.model_copy(deep=True)
    for k, v in changes.items():
        setattr(s.gpus[gpu], k, v)
    return s


async def test_healthy_h200_host_passes_before_after_and_under_load():
    before = await snap()
    assert before.gpu_count == 8 and before.gpus[0].name == "NVIDIA H200"
    g = before.gpus[3]
    assert (g.pcie_gen, g.pcie_width, g.nvlink_links, g.nvlink_down, g.mig_enabled) == (5, 16, 18, [], False)
    assert g.throttle_reasons == THROTTLE_GPU_IDLE and throttle_names(g.throttle_reasons) == ["GpuIdle"]
    verdict = gpu_verdict(H200, before, await snap(), healthy_stress())
    assert verdict.passed and verdict.findings == [], verdict.summary()
    assert gpu_verdict(H200, before).passed
    assert gpu_verdict(None, before).passed


@pytest.mark.parametrize(
    "faults, expected",
    [
        ({"pending_remaps": [2]}, {(2, "remap_pending")}),
        ({"remap_failure": [5]}, {(5, "remap_failure")}),
        ({"pcie_width": {"gpu": 1, "width": 8}}, {(1, "pcie_link")}),
        ({"missing_gpus": 1}, {(None, "gpu_count")}),
    ],
)
async def test_each_state_fault_fails_with_its_finding(faults, expected):
    verdict = gpu_verdict(H200, await snap(faults))
    assert not verdict.passed
    assert checks(verdict, "fail") == expected, verdict.summary()


async def test_remedies_point_to_the_right_fix():
    by_check = {
        f.check: f.remedy
        for f in gpu_verdict(
            H200, await snap({"pending_remaps": [0], "remap_failure": [1], "missing_gpus": 1})
        ).findings
    }
    assert by_check == {"remap_pending": "reset_gpu", "remap_failure": "rma", "gpu_count": "reboot"}


async def test_model_mig_nvlink_temperature_ecc_mode_and_hw_throttle():
    base = await snap()
    cases = [
        (edit(base, 0, name="NVIDIA H100 80GB HBM3"), (0, "gpu_model"), "fail"),
        (edit(base, 1, mig_enabled=True, mig_pending=True), (1, "mig_mode"), "fail"),
        (edit(base, 1, mig_pending=True), (1, "mig_mode"), "warn"),
        (edit(base, 2, nvlink_down=[4, 11]), (2, "nvlink_down"), "fail"),
        (edit(base, 3, temperature_c=91), (3, "temperature"), "fail"),
        (edit(base, 4, ecc_enabled=False), (4, "ecc_disabled"), "fail"),
        (edit(base, 5, throttle_reasons=THROTTLE_HW_SLOWDOWN), (5, "throttle"), "warn"),
        (edit(base, 6, lost=True), (6, "gpu_lost"), "fail"),
        (edit(base, 7, ecc_volatile_uncorrected=2), (7, "ecc_uncorrected"), "fail"),
    ]
    for s, finding, severity in cases:
        verdict = gpu_verdict(H200, s)
        assert checks(verdict) == {finding}, verdict.summary()
        assert verdict.findings[0].severity == severity
        assert verdict.passed == (severity == "warn")
    assert gpu_verdict(H200.model_copy(update={"expected_mig": None}), cases[1][0]).passed


async def test_pcie_expectations_and_idle_generation():
    base = await snap()
    idle = edit(base, 0, pcie_gen=1)  # idle GPUs drop to gen1: not a finding by itself
    assert gpu_verdict(H200, idle).passed
    gen4_slot = edit(base, 0, pcie_gen_max=4, pcie_gen=4)
    assert checks(gpu_verdict(H200.model_copy(update={"min_pcie_gen": 5}), gen4_slot)) == {(0, "pcie_link")}
    stress = healthy_stress()
    stress.gpus[6].max_pcie_gen = 3  # under load it never got above gen3: the link is bad
    assert checks(gpu_verdict(H200, base, base, stress), "fail") == {(6, "pcie_link")}


async def test_before_after_growth_not_absolute_values():
    before = edit(await snap(), 0, ecc_volatile_uncorrected=1, ecc_aggregate_uncorrected=1)
    same = before.model_copy(deep=True)
    verdict = gpu_verdict(H200, before, same)
    assert verdict.passed and checks(verdict, "warn") == {(0, "ecc_uncorrected")}  # pre-existing: flagged only
    grew = edit(before, 0, ecc_volatile_uncorrected=3, ecc_aggregate_uncorrected=3)
    verdict = gpu_verdict(H200, before, grew)
    assert not verdict.passed and checks(verdict, "fail") == {(0, "ecc_uncorrected")}
    assert "2 new uncorrected" in verdict.findings[0].evidence

    base = await snap()
    remapped = edit(base, 4, remapped_uncorrectable=1, remap_pending=True, remapped_correctable=2)
    assert checks(gpu_verdict(H200, base, remapped)) == {(4, "remapped_rows"), (4, "remap_pending")}

    with_nvlink_errors = edit(base, 2, nvlink_errors=NvlinkErrors(crc_flit=9, crc_data=0, replay=3, recovery=0))
    verdict = gpu_verdict(H200, base, with_nvlink_errors)
    assert verdict.passed and checks(verdict, "warn") == {(2, "nvlink_errors")}
    recovery = edit(base, 2, nvlink_errors=NvlinkErrors(crc_flit=0, crc_data=0, replay=0, recovery=1))
    assert checks(gpu_verdict(H200, base, recovery), "fail") == {(2, "nvlink_errors")}
    # growth already there before is not growth
    assert gpu_verdict(H200, recovery, recovery.model_copy(deep=True)).passed

    gone = base.model_copy(deep=True)
    gone.gpus = gone.gpus[:7]
    gone.gpu_count = 7
    assert checks(gpu_verdict(H200, base, gone), "fail") == {(7, "gpu_missing"), (None, "gpu_count")}


async def test_xids_under_load():
    base = await snap()
    stress = healthy_stress(
        xids=[
            XidEvent(gpu=3, xid=79, at_seconds=1.0),
            XidEvent(gpu=1, xid=48),
            XidEvent(gpu=1, xid=48),
            XidEvent(gpu=0, xid=13),
            XidEvent(gpu=2, xid=999),
        ]
    )
    verdict = gpu_verdict(H200, base, base, stress)
    assert not verdict.passed
    found = {(f.gpu, f.check, f.severity, f.remedy) for f in verdict.findings}
    assert found == {
        (3, "xid", "fail", "reboot"),
        (1, "xid", "fail", "reset_gpu"),
        (0, "xid", "warn", None),
        (2, "xid", "fail", None),
    }
    assert any("fallen off the bus" in f.evidence for f in verdict.findings)
    assert any("2 times" in f.evidence for f in verdict.findings if f.gpu == 1)
    for xid in (63, 64, 92, 94, 95):
        v = gpu_verdict(H200, base, base, healthy_stress(xids=[XidEvent(gpu=0, xid=xid)]))
        assert checks(v) == {(0, "xid")}
        assert v.passed == (xid == 92)


async def test_throttle_and_temperature_under_load():
    base = await snap()
    stress = healthy_stress()
    stress.gpus[2].hw_slowdown_samples = 4
    stress.gpus[2].throttle_reasons = THROTTLE_HW_POWER_BRAKE
    stress.gpus[5].hw_slowdown_samples = 1
    stress.gpus[5].throttle_reasons = THROTTLE_HW_SLOWDOWN
    stress.gpus[7].max_temperature_c = 90
    verdict = gpu_verdict(H200, base, base, stress)
    assert checks(verdict, "fail") == {(2, "throttle"), (7, "temperature")}
    assert checks(verdict, "warn") == {(5, "throttle")}
    assert "HwPowerBrakeSlowdown" in next(f.evidence for f in verdict.findings if f.gpu == 2)


async def test_gpu_lost_under_load_and_no_load_tool_and_missing_dcgmi():
    base = await snap()
    stress = healthy_stress(tool=None, dcgm_level=3)
    stress.gpus[1].lost = True
    verdict = gpu_verdict(H200, base, base, stress)
    assert checks(verdict, "fail") == {(1, "gpu_lost")}
    assert checks(verdict, "warn") == {(None, "stress"), (None, "dcgm")}
    after = edit(base, 1, lost=True)  # lost in the after snapshot too: one finding, not two
    assert [f.check for f in gpu_verdict(H200, base, after, stress).findings if f.gpu == 1] == ["gpu_lost"]


async def test_dcgm_results_become_findings():
    base = await snap()
    dcgm = DcgmDiag(
        level=3,
        passed=False,
        tests=[
            DcgmTestResult(name="software", status="pass"),
            DcgmTestResult(name="memory", status="fail", gpus=[2], messages=["GPU 2: DBE"]),
            DcgmTestResult(name="pcie", status="warn", gpus=[0, 1], messages=["replays"]),
        ],
    )
    verdict = gpu_verdict(H200, base, base, healthy_stress(tool="dcgmi diag -r 3", dcgm_level=3, dcgm=dcgm))
    assert checks(verdict, "fail") == {(2, "dcgm")}
    assert checks(verdict, "warn") == {(0, "dcgm"), (1, "dcgm")}
    errored = DcgmDiag(level=3, passed=False, error="Unable to connect to host engine")
    assert checks(gpu_verdict(H200, base, base, healthy_stress(dcgm=errored, dcgm_level=3)), "fail") == {(None, "dcgm")}


async def test_nvml_unavailable_is_a_clear_failure():
    down = HostGpuSnapshot(host="n1", nvml_error="NVMLError_LibraryNotFound: NVML Shared Library Not Found")
    verdict = gpu_verdict(H200, down)
    assert not verdict.passed and [f.check for f in verdict.findings] == ["nvml_unavailable"]
    assert "NVML Shared Library Not Found" in verdict.summary()


async def test_verdict_is_deterministic_and_serializable():
    before = await snap({"pending_remaps": [1, 0], "remap_failure": [3]})
    stress = healthy_stress(xids=[XidEvent(gpu=5, xid=79), XidEvent(gpu=0, xid=48)])
    a = gpu_verdict(H200, before, before, stress)
    b = gpu_verdict(H200.model_copy(), before.model_copy(deep=True), before.model_copy(deep=True), stress)
    assert a == b
    assert [(f.gpu, f.check) for f in a.findings] == sorted((f.gpu, f.check) for f in a.findings)
    assert type(a).model_validate_json(a.model_dump_json()) == a
    # host_gpu_check results can be passed as they come back from the activity
    before_result = GpuCheckResult(host="n1", passed=False, snapshot=before)
    assert gpu_verdict(H200, before_result, before_result, stress) == a


DCGM3_JSON = """{"DCGM GPU Diagnostic": {"test_categories": [
  {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "PASS"}]}]},
  {"category": "Hardware", "tests": [{"name": "Memory", "results": [
     {"gpu_ids": "0", "status": "PASS"},
     {"gpu_ids": "1", "status": "FAIL", "warnings": [{"warning": "DBE detected", "error_id": 42}]}]}]}],
  "version": "3.3.5"}}"""
DCGM4_JSON = """noise before {"DCGM Diagnostic": {"test_categories": [
  {"category": "Integration", "tests": [{"name": "pcie", "results": [
     {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
     {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Fail",
      "warnings": ["PCIe throughput below threshold"]}], "test_summary": {"status": "Fail"}},
   {"name": "nccl_tests", "results": [], "test_summary": {"status": "Skip"}}]}]}}"""


def test_parse_dcgm_json_both_shapes_and_garbage():
    d3 = parse_dcgm_json(DCGM3_JSON, 2)
    assert not d3.passed and d3.version == "3.3.5"
    mem = next(t for t in d3.tests if t.name == "Memory")
    assert (mem.status, mem.gpus, mem.messages) == ("fail", [1], ["GPU 1: DBE detected"])
    d4 = parse_dcgm_json(DCGM4_JSON, 2)
    assert [(t.name, t.status, t.gpus) for t in d4.tests] == [("pcie", "fail", [1]), ("nccl_tests", "skip", [])]
    bad = parse_dcgm_json("Error: unable to establish a connection to the host engine", 1)
    assert not bad.passed and "not JSON" in bad.error
