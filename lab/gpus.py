"""Simulated GPUs for the lab: ``SimulatedGpuProbe(spec, faults)``, a GpuProbe playing an HGX H200 server.

Healthy values are those of an 8x H200 SXM board: PCIe gen5 x16, 18 active NVLinks per GPU, ECC on and clean,
no remapped rows, about 34 C / 75 W idle (GpuIdle clock reason), about 70 C / 650 W under load, slowdown
threshold 89 C, MIG off. The server spec is the BMC emulator's (``gpus``, ``gpu_model``, ``name``, ``uuid``,
``serial``, plus ``boot_count`` / ``booted_from`` from its admin API).

Faults (``PUT /_lab/servers/<name>/gpu-faults`` on the BMC emulator; read by lab/hosts.py)::

    {"pending_remaps": [gpu, ...],             # a row remap waits for a reset: cleared by reset_gpu or a reboot,
                                               # re-armed when the fault spec changes
     "remap_failure": [gpu, ...],              # no spare rows left (permanent: RMA)
     "xid_under_load": {"gpu": i, "xid": 79},  # during every load window (79: the GPU is lost until a reboot)
     "pcie_width": {"gpu": i, "width": 8},     # link trained narrow (permanent)
     "missing_gpus": n,                        # the last n GPUs are not on the bus
     "ecc_uncorrected_under_load": {"gpu": i, "count": 1},  # every load window adds uncorrected ECC errors
     "nvml_unavailable": true}                 # no driver: NvmlUnavailable

``xid_under_load`` and ``ecc_uncorrected_under_load`` also take a list of such objects. Under-load events
happen a third of the way into the window (at most 0.5 s in).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.gpu.models import (
    THROTTLE_GPU_IDLE,
    DcgmDiag,
    DcgmTestResult,
    GpuReading,
    GpuResetResult,
    GpuSnapshot,
    HostGpuSnapshot,
    LoadSample,
    NvlinkErrors,
    ServiceRestartResult,
    XidEvent,
)
from activities.gpu.nvml import GPU_SERVICES
from activities.gpu.probe import GpuLoad, NvmlUnavailableError

DEFAULT_GPUS = 8
DEFAULT_MODEL = "NVIDIA H200"
# The eight GPU bus ids of an HGX H100/H200 board.
HGX_BUS_IDS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
NVLINKS = 18
DRIVER_VERSION = "570.124.06"
CUDA_VERSION = "12.8"
NVML_VERSION = "12.570.124.06"
IDLE_TEMP_C, LOAD_TEMP_C, SLOWDOWN_C = 34, 70, 89
IDLE_POWER_W, LOAD_POWER_W, POWER_LIMIT_W = 75.0, 650.0, 700.0
# DCGM tests per level (cumulative, DCGM 4.x names).
DCGM_TESTS = {
    1: [("Deployment", "software")],
    2: [("Integration", "pcie"), ("Hardware", "memory")],
    3: [("Hardware", "diagnostic"), ("Stress", "targeted_stress"), ("Stress", "targeted_power"),
        ("Stress", "memory_bandwidth")],
    4: [("Hardware", "memtest"), ("Hardware", "pulse_test")],
}  # fmt: skip


def _as_list(value: Any) -> list[dict]:
    if not value:
        return []
    return [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, dict)]


def _hex(seed: str, n: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


class SimulatedGpuProbe:
    """One simulated host's GPUs. Hardware state (counters, pending remaps, lost GPUs) lives in this object:
    keep one per server and call `boot()` at each power-on (what a reboot clears, it clears)."""

    def __init__(self, spec: dict | None = None, faults: dict | None = None) -> None:
        spec = dict(spec or {})
        self.name = str(spec.get("name") or "sim-host")
        self.model = str(spec.get("gpu_model") or DEFAULT_MODEL)
        gpus = spec.get("gpus")
        self.total = int(gpus) if gpus is not None else DEFAULT_GPUS
        self.seed = str(spec.get("uuid") or spec.get("serial") or self.name)
        self.uuids = [str(u) for u in spec.get("gpu_uuids") or []]  # the BMC's GPU UUIDs, so both views agree
        self.serials = [str(s) for s in spec.get("gpu_serials") or []]
        self.booted_from = spec.get("booted_from")
        self.boot_count = int(spec.get("boot_count") or 0)
        self.faults: dict = {}
        self.pending: set[int] = set()
        self.lost: set[int] = set()
        self.ecc_volatile_unc = [0] * self.total
        self.ecc_aggregate_unc = [0] * self.total
        self.remapped_unc = [0] * self.total
        self.resets: list[int] = []
        self.service_restarts = 0
        self.loads = 0
        self._loading = False
        self.set_faults(faults or {})

    # ------------------------------------------------------------ lab control

    def set_faults(self, faults: dict) -> None:
        """New fault spec; (re-)arms pending remaps."""
        self.faults = dict(faults or {})
        self.pending = {int(i) for i in self.faults.get("pending_remaps") or [] if 0 <= int(i) < self.total}
        for i in self.pending | set(self._ints("remap_failure")):
            self.remapped_unc[i] = max(self.remapped_unc[i], 1 if i in self.pending else 8)

    def boot(self, *, boot_count: int | None = None, booted_from: str | None = None) -> None:
        """A power-on: lost GPUs come back, pending remaps are applied, volatile counters start over."""
        self.lost.clear()
        self.pending.clear()
        self.ecc_volatile_unc = [0] * self.total
        if boot_count is not None:
            self.boot_count = boot_count
        if booted_from is not None:
            self.booted_from = booted_from

    def _ints(self, key: str) -> list[int]:
        return [int(i) for i in self.faults.get(key) or []]

    def _present(self) -> int:
        return max(0, self.total - int(self.faults.get("missing_gpus") or 0))

    def _check_nvml(self) -> None:
        if self.faults.get("nvml_unavailable"):
            raise NvmlUnavailableError("NVMLError_LibraryNotFound: NVML Shared Library Not Found (simulated)")

    # ------------------------------------------------------------ GpuProbe

    async def snapshot(self) -> HostGpuSnapshot:
        self._check_nvml()
        n = self._present()
        return HostGpuSnapshot(driver_version=DRIVER_VERSION, cuda_driver_version=CUDA_VERSION,
                               nvml_version=NVML_VERSION, gpu_count=n,
                               gpus=[self._gpu(i) for i in range(n)])  # fmt: skip

    def _width(self, i: int) -> int:
        for f in _as_list(self.faults.get("pcie_width")):
            if int(f.get("gpu", -1)) == i:
                return int(f.get("width", 8))
        return 16

    def _gpu(self, i: int) -> GpuSnapshot:
        bus = HGX_BUS_IDS[i] if i < len(HGX_BUS_IDS) else f"{0xC0 + i:02X}"
        base = GpuSnapshot(index=i, pci_bus_id=f"00000000:{bus}:00.0")
        if i in self.lost:
            return base.model_copy(update={"lost": True})
        h = _hex(f"{self.seed}/gpu{i}", 32)
        uuid = self.uuids[i] if i < len(self.uuids) else f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        serial = self.serials[i] if i < len(self.serials) else f"16549230{int(h[:6], 16) % 100000:05d}"
        loaded = self._loading
        return base.model_copy(update=dict(
            name=self.model, uuid=uuid if uuid.startswith("GPU-") else f"GPU-{uuid}", serial=serial,
            pcie_gen=5, pcie_gen_max=5, pcie_width=self._width(i), pcie_width_max=16, pcie_replay_count=0,
            ecc_enabled=True, ecc_volatile_corrected=0, ecc_volatile_uncorrected=self.ecc_volatile_unc[i],
            ecc_aggregate_corrected=0, ecc_aggregate_uncorrected=self.ecc_aggregate_unc[i],
            remapped_correctable=0, remapped_uncorrectable=self.remapped_unc[i],
            remap_pending=i in self.pending, remap_failure=i in self._ints("remap_failure"),
            temperature_c=(LOAD_TEMP_C if loaded else IDLE_TEMP_C) + i % 3, temperature_slowdown_c=SLOWDOWN_C,
            power_w=LOAD_POWER_W if loaded else IDLE_POWER_W, power_limit_w=POWER_LIMIT_W,
            throttle_reasons=0 if loaded else THROTTLE_GPU_IDLE,
            nvlink_links=NVLINKS, nvlink_down=[], nvlink_errors=NvlinkErrors(crc_flit=0, crc_data=0, replay=0,
                                                                             recovery=0),
            mig_enabled=False, mig_pending=False,
        ))  # fmt: skip

    def load_tools(self) -> list[str]:
        return ["simulated"]

    async def host_facts(self) -> dict[str, str]:
        facts = {"kernel": "6.8.0-lab", "boot_id": f"{self.name}-boot-{self.boot_count}",
                 "boot_count": str(self.boot_count)}  # fmt: skip
        if self.booted_from:
            facts["booted_from"] = str(self.booted_from)
        return facts

    async def start_load(self, seconds: float, dcgm_level: int | None) -> GpuLoad:
        self._check_nvml()
        self.loads += 1
        return _SimulatedLoad(self, seconds, dcgm_level)

    async def restart_services(self) -> ServiceRestartResult:
        self.service_restarts += 1
        return ServiceRestartResult(restarted=list(GPU_SERVICES))

    async def reset_gpu(self, index: int) -> GpuResetResult:
        if not 0 <= index < self._present():
            raise ApplicationError(f"nvidia-smi -r -i {index} failed: no GPU with index {index}",
                                   type="GpuResetFailed", non_retryable=True)  # fmt: skip
        if index in self.lost:
            raise ApplicationError(f"nvidia-smi -r -i {index} failed: GPU is lost; reboot the system",
                                   type="GpuResetFailed", non_retryable=True)  # fmt: skip
        self.resets.append(index)
        self.pending.discard(index)
        self.ecc_volatile_unc[index] = 0
        bus = HGX_BUS_IDS[index] if index < len(HGX_BUS_IDS) else "??"
        return GpuResetResult(gpu=index, output=f"GPU 00000000:{bus}:00.0 was successfully reset.")


class _SimulatedLoad:
    def __init__(self, probe: SimulatedGpuProbe, seconds: float, dcgm_level: int | None) -> None:
        self.probe, self.seconds, self.dcgm_level = probe, seconds, dcgm_level
        self.tool: str | None = f"simulated dcgmi diag -r {dcgm_level}" if dcgm_level else "simulated"
        self.notes: list[str] = []
        self.started = time.monotonic()
        self.event_at = min(0.5, seconds / 3)
        self.fired = False
        self.xid_gpus: set[int] = set()
        self.ecc_gpus: set[int] = set()
        probe._loading = True

    def _fire(self) -> list[XidEvent]:
        p, xids = self.probe, []
        present = p._present()
        for f in _as_list(p.faults.get("xid_under_load")):
            gpu, xid = int(f.get("gpu", 0)), int(f.get("xid", 79))
            if gpu < present and gpu not in p.lost:
                xids.append(XidEvent(gpu=gpu, xid=xid))
                self.xid_gpus.add(gpu)
                if xid == 79:
                    p.lost.add(gpu)
        for f in _as_list(p.faults.get("ecc_uncorrected_under_load")):
            gpu, count = int(f.get("gpu", 0)), int(f.get("count", 1))
            if gpu < present and gpu not in p.lost:
                p.ecc_volatile_unc[gpu] += count
                p.ecc_aggregate_unc[gpu] += count
                self.ecc_gpus.add(gpu)
                if f.get("xid"):
                    xids.append(XidEvent(gpu=gpu, xid=int(f["xid"])))
        return xids

    async def poll(self) -> LoadSample:
        await asyncio.sleep(0)
        p = self.probe
        sample = LoadSample()
        if not self.fired and time.monotonic() - self.started >= self.event_at:
            self.fired = True
            sample.xids = self._fire()
        for i in range(p._present()):
            if i in p.lost:
                sample.gpus.append(GpuReading(index=i, lost=True))
            else:
                sample.gpus.append(GpuReading(index=i, temperature_c=LOAD_TEMP_C + i % 3, power_w=LOAD_POWER_W,
                                              throttle_reasons=0, pcie_gen=5))  # fmt: skip
        return sample

    def finished(self) -> bool:
        return False

    async def stop(self) -> DcgmDiag | None:
        self.probe._loading = False
        if not self.dcgm_level:
            return None
        return self._dcgm()

    def _dcgm(self) -> DcgmDiag:
        p = self.probe
        failing: dict[str, set[int]] = {
            "software": p.pending | set(p._ints("remap_failure")),
            "pcie": {int(f.get("gpu", 0)) for f in _as_list(p.faults.get("pcie_width"))},
            "memory": self.ecc_gpus | set(p._ints("remap_failure")),
            "diagnostic": self.xid_gpus,
            "targeted_stress": self.xid_gpus,
        }
        tests = []
        for level in range(1, (self.dcgm_level or 1) + 1):
            for category, name in DCGM_TESTS[level]:
                bad = sorted(failing.get(name, set()))
                tests.append(DcgmTestResult(
                    category=category, name=name, status="fail" if bad else "pass", gpus=bad,
                    messages=[f"GPU {g}: simulated {name} failure" for g in bad],
                ))  # fmt: skip
        return DcgmDiag(level=self.dcgm_level, passed=all(t.status == "pass" for t in tests), tests=tests,
                        version="4.2.3 (simulated)")  # fmt: skip
