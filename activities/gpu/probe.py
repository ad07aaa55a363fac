"""What the host agent needs of a host: a :class:`GpuProbe` (NVML here, ``lab.gpus.SimulatedGpuProbe`` in the lab)."""

from __future__ import annotations

from typing import Protocol

from activities.gpu.models import DcgmDiag, GpuResetResult, HostGpuSnapshot, LoadSample, ServiceRestartResult


class NvmlUnavailableError(Exception):
    """NVML cannot be used on this host: no library, no loaded driver, or a driver/library mismatch."""


class GpuLoad(Protocol):
    """A running load window (started by GpuProbe.start_load)."""

    tool: str | None
    notes: list[str]

    async def poll(self) -> LoadSample:
        """The GPUs now, and the Xids seen since the last poll."""
        ...

    def finished(self) -> bool:
        """The load ended by itself (e.g. dcgmi finished)."""
        ...

    async def stop(self) -> DcgmDiag | None:
        """End the load (if still running) and release everything; the DCGM results when dcgmi ran."""
        ...


class GpuProbe(Protocol):
    async def snapshot(self) -> HostGpuSnapshot:
        """All GPUs now; raises NvmlUnavailableError."""
        ...

    async def start_load(self, seconds: float, dcgm_level: int | None) -> GpuLoad:
        """Start loading every GPU for `seconds` (dcgmi diag when asked and present); raises NvmlUnavailableError."""
        ...

    def load_tools(self) -> list[str]:
        """What can generate load on this host."""
        ...

    async def host_facts(self) -> dict[str, str]:
        """boot_id, kernel, ... whatever identifies this boot of the host."""
        ...

    async def restart_services(self) -> ServiceRestartResult:
        """Restart the GPU services (persistenced, fabric manager, DCGM) that are installed."""
        ...

    async def reset_gpu(self, index: int) -> GpuResetResult:
        """Reset one GPU; raises ApplicationError GpuResetFailed (non-retryable) when the GPU cannot be reset."""
        ...
