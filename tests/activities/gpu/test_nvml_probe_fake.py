"""NvmlProbe's NVML handling, against a stand-in `pynvml` module (this machine has no GPU): NotSupported -> None
and "n/a", GpuIsLost -> a lost GPU, Xid events during the load window, no load tool -> idle sampling."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pynvml as real
import pytest

from activities.gpu.activities import LoadWindow
from activities.gpu.models import GpuCheckRequest, StressRequest
from activities.gpu.nvml import NvmlProbe
from activities.gpu.verdict import gpu_verdict

H200 = {"name": "NVIDIA H200", "gen": 5, "width": 16, "temp": 35}


def fake_pynvml(devices: list[dict], events: list[tuple[int, int]]) -> types.ModuleType:
    """`devices[i]` may name calls that raise: {"raise": {"nvmlDeviceGetSerial": "NotSupported"}}."""
    mod = types.ModuleType("pynvml")
    mod.__dict__.update({k: v for k, v in vars(real).items() if not callable(v) or k.startswith("NVMLError")})
    pending = list(events)

    def call(name, fn):
        def wrapper(handle, *args):
            err = devices[handle].get("raise", {}).get(name)
            if err:
                raise getattr(real, f"NVMLError_{err}")()
            return fn(devices[handle], *args)

        return wrapper

    def wait(_es, _timeout):
        if pending:
            gpu, xid = pending.pop(0)
            return SimpleNamespace(eventType=real.nvmlEventTypeXidCriticalError, eventData=xid, device=gpu)
        raise real.NVMLError_Timeout()

    mod.__dict__.update(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "570.124.06", nvmlSystemGetCudaDriverVersion=lambda: 12080,
        nvmlSystemGetNVMLVersion=lambda: "12.570.124.06", nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetIndex=lambda h: h,
        nvmlEventSetCreate=lambda: object(), nvmlEventSetFree=lambda es: None, nvmlEventSetWait_v2=wait,
        nvmlDeviceGetSupportedEventTypes=lambda h: real.nvmlEventTypeAll,
        nvmlDeviceRegisterEvents=lambda h, types_, es: None,
    )  # fmt: skip
    per_device = {
        "nvmlDeviceGetName": lambda d: d["name"],
        "nvmlDeviceGetUUID": lambda d: f"GPU-{d['name'][-4:]}-{id(d)}",
        "nvmlDeviceGetSerial": lambda d: "1654923000001",
        "nvmlDeviceGetPciInfo_v3": lambda d: SimpleNamespace(busId="00000000:18:00.0"),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda d: d["gen"],
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda d: 5,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda d: d["width"],
        "nvmlDeviceGetMaxPcieLinkWidth": lambda d: 16,
        "nvmlDeviceGetPcieReplayCounter": lambda d: 0,
        "nvmlDeviceGetEccMode": lambda d: (1, 1),
        "nvmlDeviceGetTotalEccErrors": lambda d, kind, counter: d.get("ecc", {}).get((kind, counter), 0),
        "nvmlDeviceGetRemappedRows": lambda d: d.get("rows", (0, 0, 0, 0)),
        "nvmlDeviceGetTemperature": lambda d, sensor: d["temp"],
        "nvmlDeviceGetTemperatureThreshold": lambda d, which: 89,
        "nvmlDeviceGetPowerUsage": lambda d: 75_000,
        "nvmlDeviceGetEnforcedPowerLimit": lambda d: 700_000,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda d: d.get("throttle", 1),
        "nvmlDeviceGetNvLinkState": lambda d, link: _link(d, link),
        "nvmlDeviceGetFieldValues": lambda d, ids: [SimpleNamespace(nvmlReturn=real.NVML_SUCCESS,
                                                                    value=SimpleNamespace(ullVal=0)) for _ in ids],
        "nvmlDeviceGetMigMode": lambda d: (0, 0),
    }  # fmt: skip
    for name, fn in per_device.items():
        mod.__dict__[name] = call(name, fn)
    return mod


def _link(d: dict, link: int) -> int:
    if link >= d.get("links", 18):
        raise real.NVMLError_InvalidArgument()
    return 0 if link in d.get("down", ()) else 1


@pytest.fixture
def nvml(monkeypatch):
    def install(devices, events=()):
        monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices, list(events)))
        monkeypatch.setenv("PATH", "/nonexistent")  # no dcgmi, no stress tool

    return install


async def test_not_supported_is_none_and_lost_is_a_hard_fail(nvml):
    nvml(
        [
            {**H200},
            {**H200, "raise": {"nvmlDeviceGetSerial": "NotSupported", "nvmlDeviceGetMigMode": "NotSupported"}},
            {**H200, "raise": {"nvmlDeviceGetRemappedRows": "GpuIsLost"}},
            {**H200, "links": 0, "raise": {"nvmlDeviceGetPowerUsage": "NoPermission"}},
            {**H200, "rows": (0, 1, 1, 0), "down": (3,), "width": 8},
        ]
    )
    snap = await NvmlProbe().snapshot()
    assert (snap.driver_version, snap.cuda_driver_version, snap.gpu_count) == ("570.124.06", "12.8", 5)
    g0, g1, g2, g3, g4 = snap.gpus
    assert (g0.name, g0.pcie_gen, g0.nvlink_links, g0.power_w, g0.throttle_reasons) == ("NVIDIA H200", 5, 18, 75.0, 1)
    assert g0.unsupported == [] and g0.errors == {} and g0.mig_enabled is False
    assert g1.serial is None and g1.mig_enabled is None and g1.unsupported == ["serial", "mig_mode"]
    assert g2.lost and g2.name == "NVIDIA H200" and g2.temperature_c is None
    assert g3.nvlink_links is None and "nvlink" in g3.unsupported and g3.power_w is None
    assert "NoPermission" in g3.errors["power"]
    assert (g4.remap_pending, g4.remapped_uncorrectable, g4.nvlink_down, g4.pcie_width) == (True, 1, [3], 8)
    verdict = gpu_verdict(GpuCheckRequest(expected_count=5, expected_model="H200"), snap)
    assert {(f.gpu, f.check) for f in verdict.findings} == {
        (2, "gpu_lost"),
        (4, "remap_pending"),
        (4, "nvlink_down"),
        (4, "pcie_link"),
    }


async def test_load_window_collects_xids_and_says_no_tool_ran(nvml):
    nvml([{**H200}, {**H200}], events=[(1, 79)])
    stress = await LoadWindow(NvmlProbe(), StressRequest(seconds=0.3), tick=0.1).run()
    assert stress.tool is None and any("no load tool" in n for n in stress.notes)
    assert [(x.gpu, x.xid) for x in stress.xids] == [(1, 79)]
    assert [s.samples >= 2 for s in stress.gpus] == [True, True] and stress.gpus[0].max_temperature_c == 35
    findings = {(f.gpu, f.check) for f in gpu_verdict(None, await NvmlProbe().snapshot(), None, stress).findings}
    assert findings == {(1, "xid"), (None, "stress")}


async def test_dcgm_level_without_dcgmi_falls_back_and_says_so(nvml):
    nvml([{**H200}])
    stress = await LoadWindow(NvmlProbe(), StressRequest(seconds=0.1, dcgm_level=1), tick=0.05).run()
    assert stress.dcgm is None and stress.dcgm_level == 1
    assert any("dcgmi is not on PATH" in n for n in stress.notes)


def tool(directory, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


async def test_dcgmi_on_path_runs_the_diag_and_parses_it(nvml, monkeypatch, tmp_path):
    from tests.activities.gpu.test_verdict import DCGM4_JSON

    nvml([{**H200}, {**H200}])
    tool(tmp_path, "dcgmi", f"[ \"$1 $2 $3\" = 'diag -r 2' ] || exit 9\ncat <<'JSON'\n{DCGM4_JSON}\nJSON")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    stress = await LoadWindow(NvmlProbe(), StressRequest(seconds=20, dcgm_level=2), tick=0.05).run()
    assert stress.tool == "dcgmi diag -r 2" and stress.elapsed < 10  # the window ends when dcgmi does
    assert stress.dcgm and not stress.dcgm.passed and stress.dcgm.tests[0].gpus == [1]
    verdict = gpu_verdict(None, await NvmlProbe().snapshot(), None, stress)
    assert {(f.gpu, f.check) for f in verdict.failures()} == {(1, "dcgm")}


async def test_stress_tool_is_stopped_at_the_end_of_the_window(nvml, monkeypatch, tmp_path):
    nvml([{**H200}])
    tool(tmp_path, "gpu_burn", "exec sleep 60")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    stress = await LoadWindow(NvmlProbe(), StressRequest(seconds=0.3), tick=0.1).run()
    assert stress.tool == "gpu_burn 1" and stress.elapsed < 5 and stress.notes == []
