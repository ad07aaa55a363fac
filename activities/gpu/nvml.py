""":class:`NvmlProbe`: NVML through nvidia-ml-py (``import pynvml``), a stress tool or DCGM for load, systemctl and
nvidia-smi for soft fixes. See activities/gpu/activities.py for how each NVML answer is read."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
from collections.abc import Callable
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.gpu.dcgm import parse_dcgm_json
from activities.gpu.models import (
    DcgmDiag,
    GpuReading,
    GpuResetResult,
    GpuSnapshot,
    HostGpuSnapshot,
    LoadSample,
    NvlinkErrors,
    ServiceRestartResult,
    XidEvent,
)
from activities.gpu.probe import GpuLoad, NvmlUnavailableError

GPU_SERVICES = ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm")
_SUBPROCESS_TIMEOUT = 180.0


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class _Lost(Exception):
    pass


class _Nvml:
    """An nvmlInit/nvmlShutdown pair (NVML counts them); NVML errors at init -> NvmlUnavailableError."""

    def __enter__(self):
        try:
            import pynvml
        except ImportError as err:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlUnavailableError(f"nvidia-ml-py is not installed: {err}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NvmlUnavailableError(f"{type(err).__name__}: {err}") from None
        self.nv = pynvml
        return pynvml

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()


class _GpuReader:
    """Reads one GPU field by field: NotSupported -> None + `unsupported`; GpuIsLost -> `lost` and stop."""

    def __init__(self, nv: Any, gpu: GpuSnapshot) -> None:
        self.nv, self.gpu = nv, gpu

    def get(self, field: str, fn: Callable, *args: Any) -> Any:
        nv = self.nv
        try:
            return fn(*args)
        except nv.NVMLError_NotSupported:
            if field not in self.gpu.unsupported:
                self.gpu.unsupported.append(field)
        except nv.NVMLError_GpuIsLost:
            self.gpu.lost = True
            raise _Lost from None
        except nv.NVMLError as err:
            self.gpu.errors[field] = f"{type(err).__name__}: {err}"
        return None


class NvmlProbe:
    """The real host: NVML via nvidia-ml-py, load via dcgmi or a stress tool, fixes via systemctl / nvidia-smi."""

    def __init__(self, *, stress_command: list[str] | None = None, services: tuple[str, ...] = GPU_SERVICES) -> None:
        self.stress_command = stress_command
        self.services = services

    async def close(self) -> None:
        return None

    # ------------------------------------------------------------ snapshot

    async def snapshot(self) -> HostGpuSnapshot:
        return await asyncio.to_thread(self._snapshot)

    def _snapshot(self) -> HostGpuSnapshot:
        with _Nvml() as nv:
            snap = HostGpuSnapshot()
            with contextlib.suppress(nv.NVMLError):
                snap.driver_version = _text(nv.nvmlSystemGetDriverVersion())
            with contextlib.suppress(nv.NVMLError):
                cuda = int(nv.nvmlSystemGetCudaDriverVersion())
                snap.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
            with contextlib.suppress(nv.NVMLError):
                snap.nvml_version = _text(nv.nvmlSystemGetNVMLVersion())
            try:
                snap.gpu_count = int(nv.nvmlDeviceGetCount())
            except nv.NVMLError as err:
                raise NvmlUnavailableError(f"cannot count GPUs: {type(err).__name__}: {err}") from None
            snap.gpus = [self._gpu(nv, i) for i in range(snap.gpu_count)]
            return snap

    def _gpu(self, nv: Any, index: int) -> GpuSnapshot:
        gpu = GpuSnapshot(index=index)
        r = _GpuReader(nv, gpu)
        try:
            h = r.get("handle", nv.nvmlDeviceGetHandleByIndex, index)
            if h is None:
                return gpu
            name = r.get("name", nv.nvmlDeviceGetName, h)
            gpu.name = _text(name) if name is not None else None
            uuid = r.get("uuid", nv.nvmlDeviceGetUUID, h)
            gpu.uuid = _text(uuid) if uuid is not None else None
            serial = r.get("serial", nv.nvmlDeviceGetSerial, h)
            gpu.serial = _text(serial) if serial is not None else None
            pci = r.get("pci_bus_id", nv.nvmlDeviceGetPciInfo_v3, h)
            gpu.pci_bus_id = _text(pci.busId) if pci is not None else None
            gpu.pcie_gen = r.get("pcie_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
            gpu.pcie_gen_max = r.get("pcie_gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
            gpu.pcie_width = r.get("pcie_width", nv.nvmlDeviceGetCurrPcieLinkWidth, h)
            gpu.pcie_width_max = r.get("pcie_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth, h)
            gpu.pcie_replay_count = r.get("pcie_replay_count", nv.nvmlDeviceGetPcieReplayCounter, h)
            ecc = r.get("ecc_mode", nv.nvmlDeviceGetEccMode, h)
            gpu.ecc_enabled = bool(ecc[0]) if ecc is not None else None
            if gpu.ecc_enabled:
                for field, kind, counter in (
                    ("ecc_volatile_corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
                    ("ecc_volatile_uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
                    ("ecc_aggregate_corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
                    ("ecc_aggregate_uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC),
                ):
                    setattr(gpu, field, r.get(field, nv.nvmlDeviceGetTotalEccErrors, h, kind, counter))
            rows = r.get("remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
            if rows is not None:
                gpu.remapped_correctable, gpu.remapped_uncorrectable = int(rows[0]), int(rows[1])
                gpu.remap_pending, gpu.remap_failure = bool(rows[2]), bool(rows[3])
            gpu.temperature_c = r.get("temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            gpu.temperature_slowdown_c = r.get("temperature_slowdown", nv.nvmlDeviceGetTemperatureThreshold, h,
                                               nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)  # fmt: skip
            power = r.get("power", nv.nvmlDeviceGetPowerUsage, h)
            gpu.power_w = round(power / 1000, 1) if power is not None else None
            limit = r.get("power_limit", nv.nvmlDeviceGetEnforcedPowerLimit, h)
            gpu.power_limit_w = round(limit / 1000, 1) if limit is not None else None
            gpu.throttle_reasons = r.get("throttle_reasons", self._throttle_fn(nv), h)
            self._nvlink(nv, r, h)
            mig = r.get("mig_mode", nv.nvmlDeviceGetMigMode, h)
            if mig is not None:
                gpu.mig_enabled = mig[0] == nv.NVML_DEVICE_MIG_ENABLE
                gpu.mig_pending = mig[1] == nv.NVML_DEVICE_MIG_ENABLE
        except _Lost:
            pass
        return gpu

    @staticmethod
    def _throttle_fn(nv: Any) -> Callable:
        new = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)  # the old name stays as an alias
        return new or nv.nvmlDeviceGetCurrentClocksThrottleReasons

    @staticmethod
    def _nvlink(nv: Any, r: _GpuReader, h: Any) -> None:
        gpu = r.gpu
        links, down = 0, []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                state = nv.nvmlDeviceGetNvLinkState(h, link)
            except nv.NVMLError_GpuIsLost:
                gpu.lost = True
                raise _Lost from None
            except nv.NVMLError:  # NotSupported / InvalidArgument: no such link
                continue
            links += 1
            if state != nv.NVML_FEATURE_ENABLED:
                down.append(link)
        if not links:
            gpu.unsupported.append("nvlink")
            return
        gpu.nvlink_links, gpu.nvlink_down = links, down
        ids = [
            nv.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
            nv.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
            nv.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
            nv.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        ]
        values = r.get("nvlink_errors", nv.nvmlDeviceGetFieldValues, h, ids)
        if values is not None:
            got = [int(v.value.ullVal) if v.nvmlReturn == nv.NVML_SUCCESS else None for v in values]
            gpu.nvlink_errors = NvlinkErrors(crc_flit=got[0], crc_data=got[1], replay=got[2], recovery=got[3])

    # ------------------------------------------------------------ load

    def load_tools(self) -> list[str]:
        tools = []
        if shutil.which("dcgmi"):
            tools.append("dcgmi")
        if self.stress_command:
            tools.append(self.stress_command[0])
        tools += [t for t in ("gpu_burn", "gpu-burn", "dcgmproftester12", "dcgmproftester11") if shutil.which(t)]
        return tools

    def _load_command(self, seconds: float, dcgm_level: int | None,
                      notes: list[str]) -> tuple[list[str] | None, str | None]:  # fmt: skip
        secs = str(max(1, math.ceil(seconds)))
        if dcgm_level is not None:
            dcgmi = shutil.which("dcgmi")
            if dcgmi:
                return [dcgmi, "diag", "-r", str(dcgm_level), "--json"], f"dcgmi diag -r {dcgm_level}"
            notes.append("dcgmi is not on PATH: ran a stress tool instead of DCGM diagnostics")
        if self.stress_command:
            cmd = [a.replace("{seconds}", secs) for a in self.stress_command]
            return cmd, " ".join(cmd)
        for name in ("gpu_burn", "gpu-burn"):
            if path := shutil.which(name):
                return [path, secs], f"{name} {secs}"
        for name in ("dcgmproftester12", "dcgmproftester11"):
            if path := shutil.which(name):
                return [path, "--no-dcgm-validation", "-t", "1004", "-d", secs], f"{name} -t 1004 -d {secs}"
        notes.append(
            "no load tool found (dcgmi, MILLWRIGHT_GPU_STRESS_COMMAND, gpu_burn, dcgmproftester): "
            "GPUs were only sampled"
        )
        return None, None

    async def start_load(self, seconds: float, dcgm_level: int | None) -> GpuLoad:
        load = _NvmlLoad(dcgm_level)
        await asyncio.to_thread(load.open)
        cmd, tool = self._load_command(seconds, dcgm_level, load.notes)
        if cmd is not None:
            try:
                await load.spawn(cmd, tool)
            except OSError as err:
                load.notes.append(f"could not start {tool}: {err}")
        return load

    # ------------------------------------------------------------ facts and fixes

    async def host_facts(self) -> dict[str, str]:
        facts = {"kernel": os.uname().release}
        with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
            facts["boot_id"] = f.read().strip()
        return facts

    async def restart_services(self) -> ServiceRestartResult:
        if not shutil.which("systemctl"):
            raise ApplicationError("systemctl is not available on this host: cannot restart GPU services",
                                   type="GpuServicesUnsupported", non_retryable=True)  # fmt: skip
        result, failed = ServiceRestartResult(), []
        for service in self.services:
            rc, out = await _run(["systemctl", "restart", f"{service}.service"])
            if rc == 0:
                result.restarted.append(service)
            elif rc == 5 or "not found" in out.lower() or "not loaded" in out.lower():
                result.skipped.append(service)
            else:
                failed.append(f"{service}: {out.strip()[-300:] or f'exit {rc}'}")
        if failed:
            raise ApplicationError("restarting GPU services failed: " + "; ".join(failed),
                                   result.model_dump(), type="GpuServiceRestartFailed")  # fmt: skip
        return result

    async def reset_gpu(self, index: int) -> GpuResetResult:
        smi = shutil.which("nvidia-smi")
        if not smi:
            raise ApplicationError("nvidia-smi is not on PATH: cannot reset a GPU", type="GpuResetFailed",
                                   non_retryable=True)  # fmt: skip
        rc, out = await _run([smi, "-r", "-i", str(index)])
        if rc != 0:
            raise ApplicationError(f"nvidia-smi -r -i {index} failed (exit {rc}): {out.strip()[-500:]}",
                                   type="GpuResetFailed", non_retryable=True)  # fmt: skip
        return GpuResetResult(gpu=index, output=out.strip()[-2000:])


async def _run(cmd: list[str], timeout: float = _SUBPROCESS_TIMEOUT) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, _text(out)


class _NvmlLoad:
    """One NVML session for the window: per-GPU samples, an Xid event set, and the load process."""

    def __init__(self, dcgm_level: int | None) -> None:
        self.dcgm_level = dcgm_level
        self.tool: str | None = None
        self.notes: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._output: asyncio.Task | None = None
        self._nvml = _Nvml()
        self.nv: Any = None
        self.handles: list[tuple[int, Any]] = []
        self.events: Any = None
        self.is_dcgm = False

    def open(self) -> None:
        nv = self.nv = self._nvml.__enter__()
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as err:
            self._nvml.__exit__()
            raise NvmlUnavailableError(f"cannot count GPUs: {type(err).__name__}: {err}") from None
        for i in range(count):
            with contextlib.suppress(nv.NVMLError):
                self.handles.append((i, nv.nvmlDeviceGetHandleByIndex(i)))
        try:
            self.events = nv.nvmlEventSetCreate()
        except nv.NVMLError as err:
            self.notes.append(f"Xid events not watched: {err}")
            return
        for i, h in self.handles:
            try:
                supported = nv.nvmlDeviceGetSupportedEventTypes(h)
                nv.nvmlDeviceRegisterEvents(h, supported & nv.nvmlEventTypeXidCriticalError, self.events)
            except nv.NVMLError as err:
                self.notes.append(f"GPU {i}: Xid events not watched: {err}")

    async def spawn(self, cmd: list[str], tool: str | None) -> None:
        cwd = os.path.dirname(cmd[0]) if os.path.basename(cmd[0]).startswith("gpu") else None  # gpu_burn: its .ptx
        self.proc = await asyncio.create_subprocess_exec(*cmd, cwd=cwd, stdout=asyncio.subprocess.PIPE,
                                                         stderr=asyncio.subprocess.PIPE)  # fmt: skip
        self._output = asyncio.create_task(self.proc.communicate())
        self.tool = tool
        self.is_dcgm = os.path.basename(cmd[0]) == "dcgmi"

    def _read(self) -> LoadSample:
        nv, sample = self.nv, LoadSample()
        throttle = NvmlProbe._throttle_fn(nv)
        for i, h in self.handles:
            reading = GpuReading(index=i)
            try:
                with contextlib.suppress(nv.NVMLError_NotSupported):
                    reading.temperature_c = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
                with contextlib.suppress(nv.NVMLError_NotSupported):
                    reading.power_w = round(nv.nvmlDeviceGetPowerUsage(h) / 1000, 1)
                with contextlib.suppress(nv.NVMLError_NotSupported):
                    reading.throttle_reasons = throttle(h)
                with contextlib.suppress(nv.NVMLError_NotSupported):
                    reading.pcie_gen = nv.nvmlDeviceGetCurrPcieLinkGeneration(h)
            except nv.NVMLError_GpuIsLost:
                reading.lost = True
            except nv.NVMLError:
                pass
            sample.gpus.append(reading)
        if self.events is not None:
            while True:
                try:
                    data = nv.nvmlEventSetWait_v2(self.events, 1)
                except nv.NVMLError:  # Timeout: nothing more
                    break
                gpu = None
                with contextlib.suppress(nv.NVMLError):
                    gpu = nv.nvmlDeviceGetIndex(data.device)
                if data.eventType & nv.nvmlEventTypeXidCriticalError:
                    sample.xids.append(XidEvent(gpu=gpu, xid=int(data.eventData)))
        return sample

    async def poll(self) -> LoadSample:
        return await asyncio.to_thread(self._read)

    def finished(self) -> bool:
        return self._output is not None and self._output.done()

    async def stop(self) -> DcgmDiag | None:
        dcgm = None
        if self.proc is not None and self._output is not None:
            if self.proc.returncode is None and not self._output.done():
                with contextlib.suppress(ProcessLookupError):
                    self.proc.terminate()
                try:
                    await asyncio.wait_for(asyncio.shield(self._output), 15)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        self.proc.kill()
            out, err = await self._output
            if self.is_dcgm:
                dcgm = parse_dcgm_json(_text(out or b""), self.dcgm_level)
                if dcgm.error and err:
                    dcgm.error += f" (stderr: {_text(err).strip()[-300:]})"
            elif self.proc.returncode not in (0, None, -15):
                self.notes.append(f"{self.tool} exited with {self.proc.returncode}: {_text(err or b'').strip()[-300:]}")
        await asyncio.to_thread(self._close)
        return dcgm

    def _close(self) -> None:
        if self.events is not None:
            with contextlib.suppress(Exception):
                self.nv.nvmlEventSetFree(self.events)
            self.events = None
        if self.nv is not None:
            self._nvml.__exit__()
            self.nv = None
