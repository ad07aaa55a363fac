"""GPU health on one host: NVML snapshots, a load window with XID capture, soft fixes, and a pure verdict.

These activities run in the host agent (``python -m worker --host-agent``) on the host itself, polling the task
queue ``host_task_queue(<host name>)``. Everything host-specific sits behind a :class:`GpuProbe`:

* :class:`NvmlProbe` reads NVML through nvidia-ml-py (``import pynvml``). Each NVML
  call stands alone: ``NVMLError_NotSupported`` leaves that field ``None`` and names it in ``unsupported``
  ("n/a"); ``NVMLError_GpuIsLost`` marks the GPU ``lost`` (fallen off the bus, a hard fail); no library or no
  loaded driver raises :class:`NvmlUnavailableError`, which the activities turn into a retryable
  ``ApplicationError`` of type ``NvmlUnavailable`` (the host is not ready), or, for ``host_gpu_check`` with
  ``report_unavailable``, into a failed result that says so. Load comes from ``dcgmi diag -r N --json`` when a
  DCGM level is asked for and ``dcgmi`` is on PATH, otherwise from a stress tool (``MILLWRIGHT_GPU_STRESS_COMMAND``,
  ``gpu_burn``, ``dcgmproftester12/11``). Soft fixes: ``systemctl restart`` of the GPU services and
  ``nvidia-smi -r -i N``.
* ``lab.gpus.SimulatedGpuProbe`` plays an 8x H200 server with injectable faults.

:func:`gpu_verdict` is pure (no I/O, no clock): workflows import it and judge a host from a snapshot taken
before the load, one taken after it, and what was seen during it; it compares the two snapshots, not only
absolute values. Findings carry a ``remedy`` hint for remediation (reset_gpu, restart_services, reboot, rma,
reconfigure).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

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


# ---------------------------------------------------------------- models


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
        return head + ": " + "; ".join(
            f"{'GPU ' + str(f.gpu) + ' ' if f.gpu is not None else ''}{f.check}: {f.evidence}" for f in self.findings
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


# ---------------------------------------------------------------- the verdict (pure)


def gpu_verdict(
    expected: GpuCheckRequest | None,
    before: HostGpuSnapshot | GpuCheckResult,
    after: HostGpuSnapshot | GpuCheckResult | None = None,
    stress: StressResult | None = None,
) -> GpuVerdict:
    """Judge a host. Pure and deterministic: safe to call from workflow code. `before`/`after` are snapshots or
    the GpuCheckResults of host_gpu_check (their snapshots are used).

    `after` (if given) is the state judged in absolute terms (count, model, lost, pending remap, remap failure,
    PCIe width, NVLink down, temperature, MIG, ECC mode); `before` -> `after` growth is judged too (uncorrected
    ECC, remapped rows, NVLink and PCIe error counters, GPUs that disappeared); `stress` adds Xids, sustained
    hardware throttling, temperature and PCIe generation under load and DCGM results. Idle PCIe generation is not
    judged (idle GPUs drop to gen 1 to save power); under load it is.
    """
    expected = expected or GpuCheckRequest()
    if isinstance(before, GpuCheckResult):
        before = before.snapshot
    if isinstance(after, GpuCheckResult):
        after = after.snapshot
    now = after or before
    findings: list[Finding] = []
    if now.nvml_error:
        findings.append(Finding(check="nvml_unavailable", severity="fail", remedy="reboot",
                                evidence=f"NVML unavailable on the host: {now.nvml_error}"))  # fmt: skip
    else:
        findings += _state_findings(expected, now, judge_ecc=after is None or before.nvml_error is not None)
    if after is not None and not before.nvml_error and not after.nvml_error:
        findings += _growth_findings(before, after)
    if stress is not None:
        findings += _stress_findings(stress, now)
    unique: dict[tuple, Finding] = {}
    for f in findings:
        unique.setdefault((f.gpu, f.check, f.evidence), f)
    ordered = sorted(unique.values(), key=lambda f: (f.gpu is not None, f.gpu or 0, f.check, f.evidence))
    return GpuVerdict(passed=not any(f.severity == "fail" for f in ordered), findings=ordered)


def _state_findings(expected: GpuCheckRequest, snap: HostGpuSnapshot, *, judge_ecc: bool) -> list[Finding]:
    out: list[Finding] = []
    if expected.expected_count is not None and snap.gpu_count != expected.expected_count:
        out.append(Finding(check="gpu_count", severity="fail", remedy="reboot",
                           evidence=f"{expected.expected_count} GPUs expected, NVML sees {snap.gpu_count}"))
    for g in snap.gpus:
        i = g.index
        if g.lost:
            out.append(Finding(gpu=i, check="gpu_lost", severity="fail", remedy="reboot",
                               evidence="GPU is lost (NVML GpuIsLost: fallen off the bus)"))
            continue
        if expected.expected_model and g.name is not None and expected.expected_model.lower() not in g.name.lower():
            out.append(Finding(gpu=i, check="gpu_model", severity="fail",
                               evidence=f"{g.name!r} is not a {expected.expected_model!r}"))
        if g.remap_failure:
            out.append(Finding(gpu=i, check="remap_failure", severity="fail", remedy="rma",
                               evidence=f"row remapping failed ({g.remapped_uncorrectable or 0} uncorrectable rows "
                                        "remapped): no spare rows left"))
        if g.remap_pending:
            out.append(Finding(gpu=i, check="remap_pending", severity="fail", remedy="reset_gpu",
                               evidence="a row remap is pending: the GPU needs a reset before it is usable"))
        if g.ecc_enabled is False:
            out.append(Finding(gpu=i, check="ecc_disabled", severity="fail", remedy="reconfigure",
                               evidence="ECC is disabled"))
        if judge_ecc and g.ecc_volatile_uncorrected:
            out.append(Finding(gpu=i, check="ecc_uncorrected", severity="fail", remedy="reset_gpu",
                               evidence=f"{g.ecc_volatile_uncorrected} uncorrected ECC errors since the driver loaded"))
        if g.pcie_width is not None and g.pcie_width_max is not None and g.pcie_width < g.pcie_width_max:
            out.append(Finding(gpu=i, check="pcie_link", severity="fail", remedy="reboot",
                               evidence=f"PCIe link x{g.pcie_width}, capable of x{g.pcie_width_max}"))
        if expected.min_pcie_width and g.pcie_width is not None and g.pcie_width < expected.min_pcie_width:
            out.append(Finding(gpu=i, check="pcie_link", severity="fail", remedy="reboot",
                               evidence=f"PCIe link x{g.pcie_width}, x{expected.min_pcie_width} expected"))
        if expected.min_pcie_gen and g.pcie_gen_max is not None and g.pcie_gen_max < expected.min_pcie_gen:
            out.append(Finding(gpu=i, check="pcie_link", severity="fail", remedy="reconfigure",
                               evidence=f"PCIe link capable of gen{g.pcie_gen_max} only, gen{expected.min_pcie_gen} "
                                        "expected (slot or BIOS setting)"))
        if g.nvlink_down:
            out.append(Finding(gpu=i, check="nvlink_down", severity="fail", remedy="reboot",
                               evidence=f"{len(g.nvlink_down)} of {g.nvlink_links} NVLinks inactive "
                                        f"(links {', '.join(map(str, g.nvlink_down))})"))
        if _too_hot(g.temperature_c, g.temperature_slowdown_c):
            out.append(Finding(gpu=i, check="temperature", severity="fail",
                               evidence=f"{g.temperature_c} C at or over the slowdown threshold "
                                        f"{g.temperature_slowdown_c} C"))
        if g.throttle_reasons and g.throttle_reasons & THROTTLE_HW_MASK:
            out.append(Finding(gpu=i, check="throttle", severity="warn",
                               evidence="hardware clock slowdown: " + ", ".join(
                                   throttle_names(g.throttle_reasons & THROTTLE_HW_MASK))))
        if expected.expected_mig is not None and g.mig_enabled is not None and g.mig_enabled != expected.expected_mig:
            out.append(Finding(gpu=i, check="mig_mode", severity="fail", remedy="reconfigure",
                               evidence=f"MIG is {'on' if g.mig_enabled else 'off'}, "
                                        f"{'on' if expected.expected_mig else 'off'} expected"))
        elif g.mig_pending is not None and g.mig_enabled is not None and g.mig_pending != g.mig_enabled:
            out.append(Finding(gpu=i, check="mig_mode", severity="warn", remedy="reset_gpu",
                               evidence=f"MIG mode change to {'on' if g.mig_pending else 'off'} waits for a reset"))
    return out


def _too_hot(temp: int | None, slowdown: int | None) -> bool:
    return temp is not None and slowdown is not None and slowdown > 0 and temp >= slowdown


def _grew(before: int | None, after: int | None) -> int:
    if before is None or after is None:
        return 0
    return max(0, after - before)


def _growth_findings(before: HostGpuSnapshot, after: HostGpuSnapshot) -> list[Finding]:
    out: list[Finding] = []
    by_uuid = {g.uuid: g for g in after.gpus if g.uuid}
    by_index = {g.index: g for g in after.gpus}
    for b in before.gpus:
        a = by_uuid.get(b.uuid) if b.uuid else None
        if a is None and (same := by_index.get(b.index)) is not None and (not same.uuid or not b.uuid):
            a = same  # a lost GPU has no readable UUID any more: the same slot
        if a is None:
            out.append(Finding(gpu=b.index, check="gpu_missing", severity="fail", remedy="reboot",
                               evidence=f"GPU {b.uuid or b.index} ({b.pci_bus_id or 'bus id unknown'}) "
                                        "was there before the load and is gone after it"))
            continue
        if a.lost or b.lost:
            continue
        i = a.index
        ecc = _grew(b.ecc_volatile_uncorrected, a.ecc_volatile_uncorrected) or _grew(
            b.ecc_aggregate_uncorrected, a.ecc_aggregate_uncorrected)
        if ecc:
            out.append(Finding(gpu=i, check="ecc_uncorrected", severity="fail", remedy="reset_gpu",
                               evidence=f"{ecc} new uncorrected ECC errors during the load"))
        elif a.ecc_volatile_uncorrected:
            out.append(Finding(gpu=i, check="ecc_uncorrected", severity="warn", remedy="reset_gpu",
                               evidence=f"{a.ecc_volatile_uncorrected} uncorrected ECC errors from before the load"))
        if n := _grew(b.remapped_uncorrectable, a.remapped_uncorrectable):
            out.append(Finding(gpu=i, check="remapped_rows", severity="fail", remedy="reset_gpu",
                               evidence=f"{n} rows newly remapped for uncorrectable errors"))
        if n := _grew(b.remapped_correctable, a.remapped_correctable):
            out.append(Finding(gpu=i, check="remapped_rows", severity="warn",
                               evidence=f"{n} rows newly remapped for correctable errors"))
        if b.nvlink_errors and a.nvlink_errors:
            rec = _grew(b.nvlink_errors.recovery, a.nvlink_errors.recovery)
            crc = _grew(b.nvlink_errors.crc_flit, a.nvlink_errors.crc_flit) + _grew(
                b.nvlink_errors.crc_data, a.nvlink_errors.crc_data)
            rep = _grew(b.nvlink_errors.replay, a.nvlink_errors.replay)
            if rec or crc or rep:
                out.append(Finding(gpu=i, check="nvlink_errors", severity="fail" if rec else "warn",
                                   remedy="reset_gpu" if rec else None,
                                   evidence=f"NVLink errors grew during the load: {rec} recovery, {crc} CRC, "
                                            f"{rep} replay"))
        if n := _grew(b.pcie_replay_count, a.pcie_replay_count):
            out.append(Finding(gpu=i, check="pcie_replay", severity="warn",
                               evidence=f"PCIe replay counter grew by {n} during the load"))
    return out


def _stress_findings(stress: StressResult, now: HostGpuSnapshot) -> list[Finding]:
    out: list[Finding] = []
    for gpu, xid in sorted({(x.gpu, x.xid) for x in stress.xids}, key=lambda p: (p[0] is not None, p[0] or 0, p[1])):
        meaning, severity, remedy = XIDS.get(xid, ("unlisted Xid", "fail", None))
        seen = sum(1 for x in stress.xids if x.gpu == gpu and x.xid == xid)
        out.append(Finding(gpu=gpu, check="xid", severity=severity, remedy=remedy,
                           evidence=f"Xid {xid} ({meaning}) under load" + (f", {seen} times" if seen > 1 else "")))
    state = {g.index: g for g in now.gpus}
    for s in stress.gpus:
        g = state.get(s.gpu)
        if s.lost and not (g and g.lost):
            out.append(Finding(gpu=s.gpu, check="gpu_lost", severity="fail", remedy="reboot",
                               evidence="GPU was lost during the load (NVML GpuIsLost)"))
        if s.hw_slowdown_samples and s.samples:
            share = s.hw_slowdown_samples / s.samples
            sustained = share >= SUSTAINED_THROTTLE_SHARE and s.hw_slowdown_samples >= 2
            out.append(Finding(gpu=s.gpu, check="throttle", severity="fail" if sustained else "warn",
                               evidence=f"hardware slowdown in {s.hw_slowdown_samples} of {s.samples} samples under "
                                        "load: " + ", ".join(throttle_names(s.throttle_reasons & THROTTLE_HW_MASK))))
        slowdown = g.temperature_slowdown_c if g else None
        if _too_hot(s.max_temperature_c, slowdown):
            out.append(Finding(gpu=s.gpu, check="temperature", severity="fail",
                               evidence=f"reached {s.max_temperature_c} C under load, slowdown threshold {slowdown} C"))
        gen_max = g.pcie_gen_max if g else None
        if stress.tool and s.max_pcie_gen is not None and gen_max is not None and s.max_pcie_gen < gen_max:
            out.append(Finding(gpu=s.gpu, check="pcie_link", severity="fail", remedy="reboot",
                               evidence=f"PCIe ran at gen{s.max_pcie_gen} at most under load, capable of gen{gen_max}"))
    if stress.tool is None:
        out.append(Finding(check="stress", severity="warn",
                           evidence="no load was generated (no dcgmi/stress tool on the host): GPUs sampled idle"))
    if stress.dcgm_level is not None and stress.dcgm is None:
        out.append(Finding(check="dcgm", severity="warn",
                           evidence=f"DCGM diagnostics level {stress.dcgm_level} asked for, but dcgmi is not on PATH"))
    if stress.dcgm is not None:
        d = stress.dcgm
        if d.error:
            out.append(Finding(check="dcgm", severity="fail", remedy="restart_services",
                               evidence=f"dcgmi diag -r {d.level}: {d.error}"))
        for t in d.tests:
            if t.status not in ("fail", "warn"):
                continue
            text = f"DCGM {t.name} {t.status}" + (f": {'; '.join(t.messages)[:400]}" if t.messages else "")
            for gpu in t.gpus or (None,):
                out.append(Finding(gpu=gpu, check="dcgm", severity=t.status, evidence=text))
    return out


# ---------------------------------------------------------------- DCGM output


_DCGM_STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip",
                "not run": "skip", "notrun": "skip", "not supported": "skip"}  # fmt: skip
_STATUS_RANK = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}


def parse_dcgm_json(text: str, level: int | None = None) -> DcgmDiag:
    """`dcgmi diag -r N --json` output, per test (DCGM 3.x "DCGM GPU Diagnostic"/gpu_ids and 4.x
    "DCGM Diagnostic"/entity_id shapes)."""
    start, end = text.find("{"), text.rfind("}")
    try:
        body = json.loads(text[start : end + 1]) if start >= 0 else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return DcgmDiag(level=level, passed=False, error=f"dcgmi output is not JSON: {text.strip()[:300]!r}")
    root = body.get("DCGM Diagnostic") or body.get("DCGM GPU Diagnostic") or body
    tests: list[DcgmTestResult] = []
    for category in root.get("test_categories") or []:
        for test in category.get("tests") or []:
            tests.append(_dcgm_test(str(category.get("category") or ""), test))
    error = root.get("runtime_error") or body.get("runtime_error")
    if not tests and not error:
        error = "no test results in dcgmi output"
    version = root.get("version") or (body.get("metadata") or {}).get("version")
    return DcgmDiag(level=level, passed=not error and all(t.status != "fail" for t in tests), tests=tests,
                    error=str(error) if error else None, version=str(version) if version else None)  # fmt: skip


def _dcgm_test(category: str, test: dict) -> DcgmTestResult:
    results = test.get("results") or []
    worst = "skip"
    by_status: dict[str, set[int]] = {}
    messages: list[str] = []
    for r in results:
        status = _DCGM_STATUS.get(str(r.get("status", "")).strip().lower(), "warn")
        worst = max(worst, status, key=_STATUS_RANK.__getitem__)
        gpus = _dcgm_gpus(r)
        by_status.setdefault(status, set()).update(gpus)
        warnings = r.get("warnings") or []
        if isinstance(warnings, (str, dict)):
            warnings = [warnings]
        for w in warnings:
            msg = w.get("warning") if isinstance(w, dict) else w
            if msg:
                where = f"GPU {','.join(map(str, sorted(gpus)))}: " if gpus else ""
                messages.append(f"{where}{str(msg).strip()}")
    if not results:
        summary = (test.get("test_summary") or {}).get("status")
        worst = _DCGM_STATUS.get(str(summary or "skip").strip().lower(), "warn")
    return DcgmTestResult(category=category, name=str(test.get("name") or "?"), status=worst,
                          gpus=sorted(by_status.get(worst, set())) if worst in ("fail", "warn") else [],
                          messages=list(dict.fromkeys(messages)))  # fmt: skip


def _dcgm_gpus(result: dict) -> set[int]:
    if "entity_id" in result:
        if str(result.get("entity_group", "GPU")).upper() != "GPU":
            return set()
        return {int(result["entity_id"])}
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is None:
        return set()
    if isinstance(ids, int):
        return {ids}
    if isinstance(ids, list):
        return {int(x) for x in ids}
    return {int(x) for x in str(ids).replace(" ", "").split(",") if x.isdigit()}


# ---------------------------------------------------------------- the probe interface


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
            dcgm = dcgm.model_copy(update={"passed": False,
                                           "error": f"did not finish within the {self.req.seconds:g} s window"})
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

    def activities(self) -> list[Callable]:
        return [self.host_info, self.host_gpu_check, self.host_gpu_stress, self.host_restart_gpu_services,
                self.host_reset_gpu]  # fmt: skip

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
        with the finding `nvml_unavailable`."""
        try:
            snap = await self._snapshot()
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
        ids = [nv.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, nv.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
               nv.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, nv.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL]
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
        notes.append("no load tool found (dcgmi, MILLWRIGHT_GPU_STRESS_COMMAND, gpu_burn, dcgmproftester): "
                     "GPUs were only sampled")
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
        with contextlib.suppress(OSError):
            with open("/proc/sys/kernel/random/boot_id") as f:
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
    except (asyncio.TimeoutError, asyncio.CancelledError):
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
                except asyncio.TimeoutError:
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
