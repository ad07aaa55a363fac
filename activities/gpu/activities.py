"""GPU health on one host: NVML snapshots, a load window with XID capture, soft fixes, and a pure verdict.

These activities run in the host agent (``python -m worker --host-agent``) on the host itself, polling the task
queue ``host_task_queue(<host name>)``. Everything host-specific sits behind a :class:`GpuProbe`:

* :class:`NvmlProbe` (activities/gpu/nvml.py) reads NVML through nvidia-ml-py (``import pynvml``).
  Each NVML call stands alone: ``NVMLError_NotSupported`` leaves that field ``None`` and names
  it in ``unsupported`` ("n/a"); ``NVMLError_GpuIsLost`` marks the GPU ``lost`` (fallen off the bus, a hard
  fail); no library or no loaded driver raises :class:`NvmlUnavailableError`, which the activities turn into a
  retryable ``ApplicationError`` of type ``NvmlUnavailable`` (the host is not ready), or, for ``host_gpu_check``
  with ``report_unavailable``, into a failed result that says so. Load comes from ``dcgmi diag -r N --json`` when
  a DCGM level is asked for and ``dcgmi`` is on PATH, otherwise from a stress tool
  (``MILLWRIGHT_GPU_STRESS_COMMAND``, ``gpu_burn``, ``dcgmproftester12/11``). Soft fixes: ``systemctl restart``
  of the GPU services and ``nvidia-smi -r -i N``.
* ``lab.gpus.SimulatedGpuProbe`` plays an 8x H200 server with injectable faults.

:func:`gpu_verdict` (activities/gpu/verdict.py) is pure (no I/O, no clock): workflows import it and judge a
host from a snapshot taken before the load, one taken after it, and what was seen during it; it compares the two
snapshots, not only absolute values. Findings carry a ``remedy`` hint for remediation (reset_gpu,
restart_services, reboot, rma, reconfigure).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.gpu.models import (
    THROTTLE_HW_MASK,
    EmptyRequest,
    GpuCheckRequest,
    GpuCheckResult,
    GpuLoadStats,
    GpuResetRequest,
    GpuResetResult,
    HostGpuSnapshot,
    HostInfo,
    LoadSample,
    ServiceRestartResult,
    StressRequest,
    StressResult,
    XidEvent,
)
from activities.gpu.probe import GpuProbe, NvmlUnavailableError
from activities.gpu.verdict import gpu_verdict

# ---------------------------------------------------------------- models

# ---------------------------------------------------------------- the verdict (pure)
# ---------------------------------------------------------------- DCGM output
# ---------------------------------------------------------------- the probe interface
# ---------------------------------------------------------------- the activities


class LoadWindow:
    """Runs a load for `seconds`, sampling about once a `tick`, and sums it up as a StressResult.

    Shared by the ``host_gpu_stress`` activity (which heartbeats from `on_tick`) and bench/gpu_probe_check.py.
    """

    def __init__(self, probe: GpuProbe, req: StressRequest, *, tick: float = 1.0,
                 on_tick: Callable[[dict[str, Any]], Any] | None = None) -> None:  # fmt: skip
        self.probe, self.req, self.tick, self.on_tick = probe, req, tick, on_tick
        self.stats: dict[int, GpuLoadStats] = {}
        self.xids: list[XidEvent] = []

    def _add(self, sample: LoadSample, at: float) -> None:
        for x in sample.xids:
            self.xids.append(x.model_copy(update={"at_seconds": round(at, 3)}))
        for r in sample.gpus:
            s = self.stats.setdefault(r.index, GpuLoadStats(gpu=r.index))
            s.samples += 1
            s.lost = s.lost or r.lost
            if r.temperature_c is not None:
                s.max_temperature_c = max(s.max_temperature_c or r.temperature_c, r.temperature_c)
            if r.power_w is not None:
                s.max_power_w = max(s.max_power_w or r.power_w, r.power_w)
            if r.pcie_gen is not None:
                s.max_pcie_gen = max(s.max_pcie_gen or r.pcie_gen, r.pcie_gen)
            if r.throttle_reasons:
                s.throttle_reasons |= r.throttle_reasons
                if r.throttle_reasons & THROTTLE_HW_MASK:
                    s.hw_slowdown_samples += 1

    async def run(self) -> StressResult:
        load = await self.probe.start_load(self.req.seconds, self.req.dcgm_level)
        started = time.monotonic()
        deadline = started + self.req.seconds
        try:
            while True:
                sample = await load.poll()
                now = time.monotonic()
                self._add(sample, now - started)
                if self.on_tick is not None:
                    progress = {"elapsed": round(now - started, 1), "seconds": self.req.seconds,
                                "xids": [x.xid for x in self.xids]}  # fmt: skip
                    outcome = self.on_tick(progress)
                    if isinstance(outcome, Awaitable):
                        await outcome
                if load.finished() or now >= deadline:
                    break
                await asyncio.sleep(min(self.tick, max(0.0, deadline - now)))
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(load.stop())
            raise
        unfinished = not load.finished() and self.req.dcgm_level is not None and (load.tool or "").startswith("dcgmi")
        dcgm = await load.stop()
        if dcgm is not None and unfinished and not dcgm.error:
            dcgm = dcgm.model_copy(
                update={"passed": False, "error": f"did not finish within the {self.req.seconds:g} s window"}
            )
        return StressResult(
            seconds=self.req.seconds, elapsed=round(time.monotonic() - started, 3), tool=load.tool,
            dcgm_level=self.req.dcgm_level, xids=self.xids, gpus=[self.stats[i] for i in sorted(self.stats)],
            dcgm=dcgm, notes=list(load.notes),
        )  # fmt: skip


class HostAgentActivities:
    """The host agent's activities, over one GpuProbe. Registered (only these) by `python -m worker --host-agent`."""

    def __init__(self, probe: GpuProbe, host_name: str, *, heartbeat_seconds: float = 1.0) -> None:
        self.probe = probe
        self.host = host_name
        self.heartbeat_seconds = heartbeat_seconds

    async def close(self) -> None:  # a Registration resource
        close = getattr(self.probe, "close", None)
        if close is not None:
            await close()

    def _unavailable(self, err: NvmlUnavailableError) -> ApplicationError:
        return ApplicationError(
            f"NVML unavailable on host {self.host}: {err} (no NVIDIA driver loaded? the host is not ready)",
            {"host": self.host, "nvml_error": str(err)},
            type="NvmlUnavailable",
        )

    async def _snapshot(self) -> HostGpuSnapshot:
        snap = await self.probe.snapshot()
        return snap.model_copy(update={"host": self.host})

    async def _heartbeating(self, work: Awaitable[HostGpuSnapshot]) -> HostGpuSnapshot:
        """`work`, heartbeating every `heartbeat_seconds` while it runs: a caller's heartbeat timeout then tells a
        slow NVML read (a GPU off the bus can hold one for many seconds) from an agent that died with its host."""
        task = asyncio.ensure_future(work)
        try:
            while not (await asyncio.wait({task}, timeout=self.heartbeat_seconds))[0]:
                activity.heartbeat()
            return task.result()
        finally:
            task.cancel()

    @activity.defn
    async def host_info(self, _: EmptyRequest) -> HostInfo:
        """What this host is and has. Never fails for lack of NVML: says so instead."""
        facts = await self.probe.host_facts()
        try:
            snap = await self._snapshot()
        except NvmlUnavailableError as err:
            return HostInfo(host=self.host, nvml_available=False, nvml_error=str(err),
                            load_tools=self.probe.load_tools(), facts=facts)  # fmt: skip
        return HostInfo(
            host=self.host, nvml_available=True, driver_version=snap.driver_version,
            cuda_driver_version=snap.cuda_driver_version, gpu_count=snap.gpu_count,
            gpu_models=sorted({g.name for g in snap.gpus if g.name}), load_tools=self.probe.load_tools(), facts=facts,
        )  # fmt: skip

    @activity.defn
    async def host_gpu_check(self, req: GpuCheckRequest) -> GpuCheckResult:
        """A snapshot of every GPU, judged against what the host should have (gpu_verdict without a load).

        NVML unavailable: retryable ApplicationError NvmlUnavailable, or with `report_unavailable` a failed result
        with the finding `nvml_unavailable`. Heartbeats while NVML answers."""
        try:
            snap = await self._heartbeating(self._snapshot())
        except NvmlUnavailableError as err:
            if not req.report_unavailable:
                raise self._unavailable(err) from None
            snap = HostGpuSnapshot(host=self.host, nvml_error=str(err))
        verdict = gpu_verdict(req, snap)
        return GpuCheckResult(host=self.host, passed=verdict.passed, findings=verdict.findings, snapshot=snap)

    @activity.defn
    async def host_gpu_stress(self, req: StressRequest) -> StressResult:
        """Load every GPU for `seconds` (dcgmi diag -r N when asked and present, a stress tool otherwise),
        heartbeating about once a second, and report Xids, throttling, temperatures and DCGM results seen."""
        window = LoadWindow(self.probe, req, tick=self.heartbeat_seconds, on_tick=activity.heartbeat)
        try:
            result = await window.run()
        except NvmlUnavailableError as err:
            raise self._unavailable(err) from None
        return result.model_copy(update={"host": self.host})

    @activity.defn
    async def host_restart_gpu_services(self, _: EmptyRequest) -> ServiceRestartResult:
        """Restart nvidia-persistenced, nvidia-fabricmanager and nvidia-dcgm where installed (a soft fix)."""
        result = await self.probe.restart_services()
        return result.model_copy(update={"host": self.host})

    @activity.defn
    async def host_reset_gpu(self, req: GpuResetRequest) -> GpuResetResult:
        """Reset one GPU (nvidia-smi -r -i N): clears a pending row remap and volatile ECC counters."""
        result = await self.probe.reset_gpu(req.index)
        return result.model_copy(update={"host": self.host})


# ---------------------------------------------------------------- NVML
