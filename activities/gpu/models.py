"""The host agent's task queue, NVML's throttle reasons, and the models of GPU checks, load runs and soft fixes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from activities.models import StrictModel

HOST_TASK_QUEUE_PREFIX = "millwright-host-"


def host_task_queue(name: str) -> str:
    """The task queue the host agent of host `name` polls."""
    return f"{HOST_TASK_QUEUE_PREFIX}{name}"


# Clock event ("throttle") reason bits, as NVML defines them (nvmlClocksEventReason*), so the verdict needs no pynvml.
THROTTLE_GPU_IDLE = 0x1
THROTTLE_APPLICATIONS_CLOCKS = 0x2
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SYNC_BOOST = 0x10
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
THROTTLE_DISPLAY_CLOCKS = 0x100
THROTTLE_HW_MASK = THROTTLE_HW_SLOWDOWN | THROTTLE_HW_THERMAL | THROTTLE_HW_POWER_BRAKE
_THROTTLE_NAMES = {
    THROTTLE_GPU_IDLE: "GpuIdle", THROTTLE_APPLICATIONS_CLOCKS: "ApplicationsClocksSetting",
    THROTTLE_SW_POWER_CAP: "SwPowerCap", THROTTLE_HW_SLOWDOWN: "HwSlowdown", THROTTLE_SYNC_BOOST: "SyncBoost",
    THROTTLE_SW_THERMAL: "SwThermalSlowdown", THROTTLE_HW_THERMAL: "HwThermalSlowdown",
    THROTTLE_HW_POWER_BRAKE: "HwPowerBrakeSlowdown", THROTTLE_DISPLAY_CLOCKS: "DisplayClockSetting",
}  # fmt: skip


def throttle_names(mask: int | None) -> list[str]:
    """NVML's names for the bits set in a clock event reasons bitmask."""
    if not mask:
        return []
    names = [name for bit, name in _THROTTLE_NAMES.items() if mask & bit]
    rest = mask & ~sum(_THROTTLE_NAMES)
    return names + ([f"0x{rest:x}"] if rest else [])


Severity = Literal["fail", "warn"]
Remedy = Literal["reset_gpu", "restart_services", "reboot", "rma", "reconfigure"]

# Xid -> (meaning, severity during burn-in, remedy). Unlisted Xids fail without a remedy hint.
XIDS: dict[int, tuple[str, Severity, Remedy | None]] = {
    13: ("graphics engine exception (usually the application)", "warn", None),
    31: ("GPU memory page fault (usually the application)", "warn", None),
    43: ("GPU stopped processing (usually the application)", "warn", None),
    45: ("preemptive cleanup after an earlier error", "warn", None),
    48: ("double-bit ECC error", "fail", "reset_gpu"),
    61: ("internal micro-controller breakpoint", "fail", "reset_gpu"),
    62: ("internal micro-controller halt", "fail", "reset_gpu"),
    63: ("row remapping / page retirement recorded (reset pending)", "fail", "reset_gpu"),
    64: ("row remapping / page retirement failure", "fail", "rma"),
    74: ("NVLink error", "fail", "reset_gpu"),
    79: ("GPU has fallen off the bus", "fail", "reboot"),
    92: ("high single-bit ECC error rate", "warn", None),
    94: ("contained ECC error", "fail", "reset_gpu"),
    95: ("uncontained ECC error", "fail", "reset_gpu"),
    119: ("GSP RPC timeout", "fail", "reboot"),
    120: ("GSP error", "fail", "reboot"),
    140: ("unrecovered ECC error", "fail", "reset_gpu"),
    154: ("GPU recovery action changed", "fail", "reboot"),
}

# Share of load samples with a hardware slowdown bit above which throttling counts as sustained (a fail).
SUSTAINED_THROTTLE_SHARE = 0.5


class NvlinkErrors(StrictModel):
    """NVLink error counter totals over all links of one GPU (None: not readable)."""

    crc_flit: int | None = None
    crc_data: int | None = None
    replay: int | None = None
    recovery: int | None = None


class GpuSnapshot(StrictModel):
    """One GPU as NVML reports it. None means not supported ("n/a", named in `unsupported`) or not readable
    (the NVML error is in `errors`); a `lost` GPU (GpuIsLost, fallen off the bus) has little else filled."""

    index: int
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    lost: bool = False
    pcie_gen: int | None = None
    pcie_gen_max: int | None = Field(None, description="Highest generation this GPU and slot can run")
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_replay_count: int | None = None
    ecc_enabled: bool | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    remapped_correctable: int | None = Field(None, description="Rows remapped for correctable errors")
    remapped_uncorrectable: int | None = Field(None, description="Rows remapped for uncorrectable errors")
    remap_pending: bool | None = Field(None, description="A remap waits for a GPU reset")
    remap_failure: bool | None = Field(None, description="A remap failed (no spare rows): RMA")
    temperature_c: int | None = None
    temperature_slowdown_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_reasons: int | None = Field(None, description="NVML clock event reasons bitmask (THROTTLE_*)")
    nvlink_links: int | None = Field(None, description="Links NVML reports a state for; None: no NVLink")
    nvlink_down: list[int] = Field(default_factory=list, description="Links whose state is not active")
    nvlink_errors: NvlinkErrors | None = None
    mig_enabled: bool | None = None
    mig_pending: bool | None = None
    unsupported: list[str] = Field(default_factory=list)
    errors: dict[str, str] = Field(default_factory=dict)


class HostGpuSnapshot(StrictModel):
    """All GPUs of a host at one moment. `nvml_error` is set (and `gpus` empty) when NVML cannot be used."""

    host: str = ""
    nvml_error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None
    gpu_count: int = 0
    gpus: list[GpuSnapshot] = Field(default_factory=list)


class GpuCheckRequest(StrictModel):
    """What the host should have. Also the `expected` argument of :func:`gpu_verdict`."""

    expected_count: int | None = Field(None, ge=0)
    expected_model: str | None = Field(None, description="Case-insensitive part of the NVML name, e.g. 'H200'")
    expected_mig: bool | None = Field(False, description="MIG mode the GPUs must be in; None: not checked")
    min_pcie_gen: int | None = Field(None, ge=1)
    min_pcie_width: int | None = Field(None, ge=1)
    report_unavailable: bool = Field(
        False, description="NVML unavailable -> a failed result saying so, instead of a retryable NvmlUnavailable"
    )


class Finding(StrictModel):
    gpu: int | None = Field(None, description="GPU index; None: the host as a whole")
    check: str
    severity: Severity
    evidence: str
    remedy: Remedy | None = None


class GpuVerdict(StrictModel):
    passed: bool
    findings: list[Finding] = Field(default_factory=list)

    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "fail"]

    def summary(self) -> str:
        if not self.findings:
            return "pass"
        head = "pass" if self.passed else "fail"
        return (
            head
            + ": "
            + "; ".join(
                f"{'GPU ' + str(f.gpu) + ' ' if f.gpu is not None else ''}{f.check}: {f.evidence}"
                for f in self.findings
            )
        )


class GpuCheckResult(StrictModel):
    host: str
    passed: bool
    findings: list[Finding] = Field(default_factory=list)
    snapshot: HostGpuSnapshot


class StressRequest(StrictModel):
    seconds: float = Field(gt=0, le=7 * 24 * 3600, description="Length of the load window")
    dcgm_level: int | None = Field(None, ge=1, le=4, description="Run `dcgmi diag -r N` when dcgmi is on PATH")


class XidEvent(StrictModel):
    gpu: int | None
    xid: int
    at_seconds: float = Field(0.0, description="When it was seen, from the start of the window")


class GpuReading(StrictModel):
    """One GPU sampled during the load."""

    index: int
    lost: bool = False
    temperature_c: int | None = None
    power_w: float | None = None
    throttle_reasons: int | None = None
    pcie_gen: int | None = None


class LoadSample(StrictModel):
    gpus: list[GpuReading] = Field(default_factory=list)
    xids: list[XidEvent] = Field(default_factory=list)


class GpuLoadStats(StrictModel):
    """What one GPU did during the window."""

    gpu: int
    samples: int = 0
    lost: bool = False
    max_temperature_c: int | None = None
    max_power_w: float | None = None
    throttle_reasons: int = Field(0, description="OR of every sample's reasons")
    hw_slowdown_samples: int = Field(0, description="Samples with HwSlowdown/HwThermal/HwPowerBrake set")
    max_pcie_gen: int | None = None


class DcgmTestResult(StrictModel):
    category: str = ""
    name: str
    status: Literal["pass", "fail", "warn", "skip"]
    gpus: list[int] = Field(default_factory=list, description="GPUs whose result is this test's status (fail/warn)")
    messages: list[str] = Field(default_factory=list)


class DcgmDiag(StrictModel):
    level: int | None = None
    passed: bool
    tests: list[DcgmTestResult] = Field(default_factory=list)
    error: str | None = None
    version: str | None = None


class StressResult(StrictModel):
    host: str = ""
    seconds: float
    elapsed: float = 0.0
    tool: str | None = Field(None, description="What generated the load; None: nothing did (idle sampling)")
    dcgm_level: int | None = None
    xids: list[XidEvent] = Field(default_factory=list)
    gpus: list[GpuLoadStats] = Field(default_factory=list)
    dcgm: DcgmDiag | None = None
    notes: list[str] = Field(default_factory=list)


class GpuResetRequest(StrictModel):
    index: int = Field(ge=0)


class GpuResetResult(StrictModel):
    host: str = ""
    gpu: int
    output: str = ""


class ServiceRestartResult(StrictModel):
    host: str = ""
    restarted: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list, description="Not installed on this host")


class HostInfo(StrictModel):
    host: str
    nvml_available: bool
    nvml_error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpu_count: int = 0
    gpu_models: list[str] = Field(default_factory=list)
    load_tools: list[str] = Field(default_factory=list)
    facts: dict[str, str] = Field(default_factory=dict, description="boot_id, kernel, ... as the probe knows them")


class EmptyRequest(StrictModel):
    pass
