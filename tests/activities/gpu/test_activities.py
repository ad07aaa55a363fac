"""HostAgentActivities over NvmlProbe on this GPU-less machine (NvmlUnavailable, clearly) and over the simulated
probe (the load window: heartbeats, Xids, counters, DCGM; the soft fixes)."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.gpu.activities import HostAgentActivities
from activities.gpu.models import EmptyRequest, GpuCheckRequest, GpuResetRequest, StressRequest, host_task_queue
from activities.gpu.nvml import NvmlProbe
from activities.gpu.probe import NvmlUnavailableError
from activities.gpu.verdict import gpu_verdict
from lab.gpus import SimulatedGpuProbe

H200 = GpuCheckRequest(expected_count=8, expected_model="H200")


def nvml_present() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


gpu_less = pytest.mark.skipif(nvml_present(), reason="this machine has NVML; the test is for GPU-less hosts")


def test_host_task_queue():
    assert host_task_queue("gpu-node-001") == "millwright-host-gpu-node-001"


@gpu_less
async def test_nvml_probe_without_nvml_raises_unavailable():
    with pytest.raises(NvmlUnavailableError, match="LibraryNotFound"):
        await NvmlProbe().snapshot()
    with pytest.raises(NvmlUnavailableError):
        await NvmlProbe().start_load(1, None)


@gpu_less
async def test_check_without_nvml_is_a_retryable_nvml_unavailable_error():
    acts = HostAgentActivities(NvmlProbe(), "gpu-less")
    env = ActivityEnvironment()
    with pytest.raises(ApplicationError) as info:
        await env.run(acts.host_gpu_check, H200)
    err = info.value
    assert err.type == "NvmlUnavailable" and not err.non_retryable
    assert "gpu-less" in err.message and "NVML Shared Library Not Found" in err.message
    assert err.details[0]["host"] == "gpu-less"
    with pytest.raises(ApplicationError, match="NVML unavailable") as info:
        await env.run(acts.host_gpu_stress, StressRequest(seconds=1))
    assert info.value.type == "NvmlUnavailable"


@gpu_less
async def test_check_without_nvml_can_report_it_as_a_failed_result():
    acts = HostAgentActivities(NvmlProbe(), "gpu-less")
    result = await ActivityEnvironment().run(acts.host_gpu_check, H200.model_copy(update={"report_unavailable": True}))
    assert not result.passed and result.snapshot.nvml_error
    assert [f.check for f in result.findings] == ["nvml_unavailable"]
    info = await ActivityEnvironment().run(acts.host_info, EmptyRequest())
    assert not info.nvml_available and "LibraryNotFound" in info.nvml_error and info.facts.get("kernel")


async def test_stress_window_heartbeats_and_sees_xid_79_and_ecc():
    probe = SimulatedGpuProbe(
        {"name": "n1"}, {"xid_under_load": {"gpu": 3, "xid": 79}, "ecc_uncorrected_under_load": {"gpu": 5, "count": 2}}
    )
    acts = HostAgentActivities(probe, "n1", heartbeat_seconds=0.2)
    env = ActivityEnvironment()
    beats: list = []
    env.on_heartbeat = lambda *details: beats.append(details)
    before = await env.run(acts.host_gpu_check, H200)
    assert before.passed, before.findings
    stress = await env.run(acts.host_gpu_stress, StressRequest(seconds=1.0))
    assert stress.host == "n1" and stress.tool == "simulated" and 0.9 <= stress.elapsed < 3
    assert len(beats) >= 4 and beats[-1][0]["xids"] == [79]
    assert [(x.gpu, x.xid) for x in stress.xids] == [(3, 79)]
    assert stress.gpus[3].lost and stress.gpus[0].max_temperature_c >= 70 and stress.gpus[0].max_power_w >= 600
    after = await env.run(acts.host_gpu_check, H200)
    assert {(f.gpu, f.check) for f in after.findings} == {(3, "gpu_lost"), (5, "ecc_uncorrected")}
    verdict = gpu_verdict(H200, before.snapshot, after.snapshot, stress)
    assert {(f.gpu, f.check) for f in verdict.failures()} == {(3, "gpu_lost"), (3, "xid"), (5, "ecc_uncorrected")}
    # a lost GPU cannot be reset; a reboot brings it back
    with pytest.raises(ApplicationError) as info:
        await env.run(acts.host_reset_gpu, GpuResetRequest(index=3))
    assert info.value.type == "GpuResetFailed" and info.value.non_retryable
    probe.boot(boot_count=2)
    assert (await env.run(acts.host_gpu_check, H200)).passed


async def test_a_slow_check_heartbeats_while_nvml_answers():
    # A caller's heartbeat timeout tells this from an agent that died with its host (workflows/common/call_options.py).
    class SlowProbe(SimulatedGpuProbe):
        async def snapshot(self):
            await asyncio.sleep(0.7)
            return await super().snapshot()

    acts = HostAgentActivities(SlowProbe({"name": "n1"}, {}), "n1", heartbeat_seconds=0.2)
    env = ActivityEnvironment()
    beats: list = []
    env.on_heartbeat = lambda *details: beats.append(details)
    assert (await env.run(acts.host_gpu_check, H200)).passed
    assert 2 <= len(beats) <= 4


async def test_soft_fixes_on_the_simulated_host():
    probe = SimulatedGpuProbe({"name": "n1"}, {"pending_remaps": [2]})
    acts = HostAgentActivities(probe, "n1")
    env = ActivityEnvironment()
    first = await env.run(acts.host_gpu_check, H200)
    assert [(f.gpu, f.check) for f in first.findings] == [(2, "remap_pending")]
    reset = await env.run(acts.host_reset_gpu, GpuResetRequest(index=2))
    assert reset.gpu == 2 and "successfully reset" in reset.output and probe.resets == [2]
    assert (await env.run(acts.host_gpu_check, H200)).passed
    restarted = await env.run(acts.host_restart_gpu_services, EmptyRequest())
    assert restarted.restarted == ["nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm"]
    assert probe.service_restarts == 1


async def test_simulated_dcgm_levels_and_host_info():
    probe = SimulatedGpuProbe({"name": "n1", "boot_count": 3, "booted_from": "Pxe"}, {"pcie_width": {"gpu": 1}})
    acts = HostAgentActivities(probe, "n1", heartbeat_seconds=0.1)
    env = ActivityEnvironment()
    stress = await env.run(acts.host_gpu_stress, StressRequest(seconds=0.3, dcgm_level=2))
    assert stress.dcgm and [t.name for t in stress.dcgm.tests] == ["software", "pcie", "memory"]
    assert not stress.dcgm.passed and next(t for t in stress.dcgm.tests if t.name == "pcie").gpus == [1]
    info = await env.run(acts.host_info, EmptyRequest())
    assert info.nvml_available and info.gpu_count == 8 and info.gpu_models == ["NVIDIA H200"]
    assert info.facts["booted_from"] == "Pxe" and info.facts["boot_id"] == "n1-boot-3"


async def test_cancelled_stress_stops_the_load():
    import asyncio

    probe = SimulatedGpuProbe({"name": "n1"})
    acts = HostAgentActivities(probe, "n1", heartbeat_seconds=0.1)
    env = ActivityEnvironment()
    task = asyncio.create_task(env.run(acts.host_gpu_stress, StressRequest(seconds=30)))
    await asyncio.sleep(0.3)
    assert probe._loading
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not probe._loading and probe.loads == 1
