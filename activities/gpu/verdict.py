""":func:`gpu_verdict` is pure (no I/O, no clock): workflows import it and judge a host from a snapshot taken
before the load, one taken after it, and what was seen during it; it compares the two snapshots, not only
absolute values. Findings carry a ``remedy`` hint for remediation (reset_gpu, restart_services, reboot, rma,
reconfigure)."""

from __future__ import annotations

from activities.gpu.models import (
    SUSTAINED_THROTTLE_SHARE,
    THROTTLE_HW_MASK,
    XIDS,
    Finding,
    GpuCheckRequest,
    GpuCheckResult,
    GpuVerdict,
    HostGpuSnapshot,
    StressResult,
    throttle_names,
)


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


def _state_findings(expected: GpuCheckRequest, snap: HostGpuSnapshot, *, judge_ecc: bool) -> list[Finding]:  # noqa: C901 (one check per NVML state the verdict judges, in the order the docs list them)
    out: list[Finding] = []
    if expected.expected_count is not None and snap.gpu_count != expected.expected_count:
        out.append(
            Finding(
                check="gpu_count",
                severity="fail",
                remedy="reboot",
                evidence=f"{expected.expected_count} GPUs expected, NVML sees {snap.gpu_count}",
            )
        )
    for g in snap.gpus:
        i = g.index
        if g.lost:
            out.append(
                Finding(
                    gpu=i,
                    check="gpu_lost",
                    severity="fail",
                    remedy="reboot",
                    evidence="GPU is lost (NVML GpuIsLost: fallen off the bus)",
                )
            )
            continue
        if expected.expected_model and g.name is not None and expected.expected_model.lower() not in g.name.lower():
            out.append(
                Finding(
                    gpu=i,
                    check="gpu_model",
                    severity="fail",
                    evidence=f"{g.name!r} is not a {expected.expected_model!r}",
                )
            )
        if g.remap_failure:
            out.append(
                Finding(
                    gpu=i,
                    check="remap_failure",
                    severity="fail",
                    remedy="rma",
                    evidence=f"row remapping failed ({g.remapped_uncorrectable or 0} uncorrectable rows "
                    "remapped): no spare rows left",
                )
            )
        if g.remap_pending:
            out.append(
                Finding(
                    gpu=i,
                    check="remap_pending",
                    severity="fail",
                    remedy="reset_gpu",
                    evidence="a row remap is pending: the GPU needs a reset before it is usable",
                )
            )
        if g.ecc_enabled is False:
            out.append(
                Finding(gpu=i, check="ecc_disabled", severity="fail", remedy="reconfigure", evidence="ECC is disabled")
            )
        if judge_ecc and g.ecc_volatile_uncorrected:
            out.append(
                Finding(
                    gpu=i,
                    check="ecc_uncorrected",
                    severity="fail",
                    remedy="reset_gpu",
                    evidence=f"{g.ecc_volatile_uncorrected} uncorrected ECC errors since the driver loaded",
                )
            )
        if g.pcie_width is not None and g.pcie_width_max is not None and g.pcie_width < g.pcie_width_max:
            out.append(
                Finding(
                    gpu=i,
                    check="pcie_link",
                    severity="fail",
                    remedy="reboot",
                    evidence=f"PCIe link x{g.pcie_width}, capable of x{g.pcie_width_max}",
                )
            )
        if expected.min_pcie_width and g.pcie_width is not None and g.pcie_width < expected.min_pcie_width:
            out.append(
                Finding(
                    gpu=i,
                    check="pcie_link",
                    severity="fail",
                    remedy="reboot",
                    evidence=f"PCIe link x{g.pcie_width}, x{expected.min_pcie_width} expected",
                )
            )
        if expected.min_pcie_gen and g.pcie_gen_max is not None and g.pcie_gen_max < expected.min_pcie_gen:
            out.append(
                Finding(
                    gpu=i,
                    check="pcie_link",
                    severity="fail",
                    remedy="reconfigure",
                    evidence=f"PCIe link capable of gen{g.pcie_gen_max} only, gen{expected.min_pcie_gen} "
                    "expected (slot or BIOS setting)",
                )
            )
        if g.nvlink_down:
            out.append(
                Finding(
                    gpu=i,
                    check="nvlink_down",
                    severity="fail",
                    remedy="reboot",
                    evidence=f"{len(g.nvlink_down)} of {g.nvlink_links} NVLinks inactive "
                    f"(links {', '.join(map(str, g.nvlink_down))})",
                )
            )
        if _too_hot(g.temperature_c, g.temperature_slowdown_c):
            out.append(
                Finding(
                    gpu=i,
                    check="temperature",
                    severity="fail",
                    evidence=f"{g.temperature_c} C at or over the slowdown threshold {g.temperature_slowdown_c} C",
                )
            )
        if g.throttle_reasons and g.throttle_reasons & THROTTLE_HW_MASK:
            out.append(
                Finding(
                    gpu=i,
                    check="throttle",
                    severity="warn",
                    evidence="hardware clock slowdown: "
                    + ", ".join(throttle_names(g.throttle_reasons & THROTTLE_HW_MASK)),
                )
            )
        if expected.expected_mig is not None and g.mig_enabled is not None and g.mig_enabled != expected.expected_mig:
            out.append(
                Finding(
                    gpu=i,
                    check="mig_mode",
                    severity="fail",
                    remedy="reconfigure",
                    evidence=f"MIG is {'on' if g.mig_enabled else 'off'}, "
                    f"{'on' if expected.expected_mig else 'off'} expected",
                )
            )
        elif g.mig_pending is not None and g.mig_enabled is not None and g.mig_pending != g.mig_enabled:
            out.append(
                Finding(
                    gpu=i,
                    check="mig_mode",
                    severity="warn",
                    remedy="reset_gpu",
                    evidence=f"MIG mode change to {'on' if g.mig_pending else 'off'} waits for a reset",
                )
            )
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
            out.append(
                Finding(
                    gpu=b.index,
                    check="gpu_missing",
                    severity="fail",
                    remedy="reboot",
                    evidence=f"GPU {b.uuid or b.index} ({b.pci_bus_id or 'bus id unknown'}) "
                    "was there before the load and is gone after it",
                )
            )
            continue
        if a.lost or b.lost:
            continue
        i = a.index
        ecc = _grew(b.ecc_volatile_uncorrected, a.ecc_volatile_uncorrected) or _grew(
            b.ecc_aggregate_uncorrected, a.ecc_aggregate_uncorrected
        )
        if ecc:
            out.append(
                Finding(
                    gpu=i,
                    check="ecc_uncorrected",
                    severity="fail",
                    remedy="reset_gpu",
                    evidence=f"{ecc} new uncorrected ECC errors during the load",
                )
            )
        elif a.ecc_volatile_uncorrected:
            out.append(
                Finding(
                    gpu=i,
                    check="ecc_uncorrected",
                    severity="warn",
                    remedy="reset_gpu",
                    evidence=f"{a.ecc_volatile_uncorrected} uncorrected ECC errors from before the load",
                )
            )
        if n := _grew(b.remapped_uncorrectable, a.remapped_uncorrectable):
            out.append(
                Finding(
                    gpu=i,
                    check="remapped_rows",
                    severity="fail",
                    remedy="reset_gpu",
                    evidence=f"{n} rows newly remapped for uncorrectable errors",
                )
            )
        if n := _grew(b.remapped_correctable, a.remapped_correctable):
            out.append(
                Finding(
                    gpu=i,
                    check="remapped_rows",
                    severity="warn",
                    evidence=f"{n} rows newly remapped for correctable errors",
                )
            )
        if b.nvlink_errors and a.nvlink_errors:
            rec = _grew(b.nvlink_errors.recovery, a.nvlink_errors.recovery)
            crc = _grew(b.nvlink_errors.crc_flit, a.nvlink_errors.crc_flit) + _grew(
                b.nvlink_errors.crc_data, a.nvlink_errors.crc_data
            )
            rep = _grew(b.nvlink_errors.replay, a.nvlink_errors.replay)
            if rec or crc or rep:
                out.append(
                    Finding(
                        gpu=i,
                        check="nvlink_errors",
                        severity="fail" if rec else "warn",
                        remedy="reset_gpu" if rec else None,
                        evidence=f"NVLink errors grew during the load: {rec} recovery, {crc} CRC, {rep} replay",
                    )
                )
        if n := _grew(b.pcie_replay_count, a.pcie_replay_count):
            out.append(
                Finding(
                    gpu=i,
                    check="pcie_replay",
                    severity="warn",
                    evidence=f"PCIe replay counter grew by {n} during the load",
                )
            )
    return out


def _stress_findings(stress: StressResult, now: HostGpuSnapshot) -> list[Finding]:
    out: list[Finding] = []
    for gpu, xid in sorted({(x.gpu, x.xid) for x in stress.xids}, key=lambda p: (p[0] is not None, p[0] or 0, p[1])):
        meaning, severity, remedy = XIDS.get(xid, ("unlisted Xid", "fail", None))
        seen = sum(1 for x in stress.xids if x.gpu == gpu and x.xid == xid)
        out.append(
            Finding(
                gpu=gpu,
                check="xid",
                severity=severity,
                remedy=remedy,
                evidence=f"Xid {xid} ({meaning}) under load" + (f", {seen} times" if seen > 1 else ""),
            )
        )
    state = {g.index: g for g in now.gpus}
    for s in stress.gpus:
        g = state.get(s.gpu)
        if s.lost and not (g and g.lost):
            out.append(
                Finding(
                    gpu=s.gpu,
                    check="gpu_lost",
                    severity="fail",
                    remedy="reboot",
                    evidence="GPU was lost during the load (NVML GpuIsLost)",
                )
            )
        if s.hw_slowdown_samples and s.samples:
            share = s.hw_slowdown_samples / s.samples
            sustained = share >= SUSTAINED_THROTTLE_SHARE and s.hw_slowdown_samples >= 2
            out.append(
                Finding(
                    gpu=s.gpu,
                    check="throttle",
                    severity="fail" if sustained else "warn",
                    evidence=f"hardware slowdown in {s.hw_slowdown_samples} of {s.samples} samples under "
                    "load: " + ", ".join(throttle_names(s.throttle_reasons & THROTTLE_HW_MASK)),
                )
            )
        slowdown = g.temperature_slowdown_c if g else None
        if _too_hot(s.max_temperature_c, slowdown):
            out.append(
                Finding(
                    gpu=s.gpu,
                    check="temperature",
                    severity="fail",
                    evidence=f"reached {s.max_temperature_c} C under load, slowdown threshold {slowdown} C",
                )
            )
        gen_max = g.pcie_gen_max if g else None
        if stress.tool and s.max_pcie_gen is not None and gen_max is not None and s.max_pcie_gen < gen_max:
            out.append(
                Finding(
                    gpu=s.gpu,
                    check="pcie_link",
                    severity="fail",
                    remedy="reboot",
                    evidence=f"PCIe ran at gen{s.max_pcie_gen} at most under load, capable of gen{gen_max}",
                )
            )
    if stress.tool is None:
        out.append(
            Finding(
                check="stress",
                severity="warn",
                evidence="no load was generated (no dcgmi/stress tool on the host): GPUs sampled idle",
            )
        )
    if stress.dcgm_level is not None and stress.dcgm is None:
        out.append(
            Finding(
                check="dcgm",
                severity="warn",
                evidence=f"DCGM diagnostics level {stress.dcgm_level} asked for, but dcgmi is not on PATH",
            )
        )
    if stress.dcgm is not None:
        d = stress.dcgm
        if d.error:
            out.append(
                Finding(
                    check="dcgm",
                    severity="fail",
                    remedy="restart_services",
                    evidence=f"dcgmi diag -r {d.level}: {d.error}",
                )
            )
        for t in d.tests:
            if t.status not in ("fail", "warn"):
                continue
            text = f"DCGM {t.name} {t.status}" + (f": {'; '.join(t.messages)[:400]}" if t.messages else "")
            for gpu in t.gpus or (None,):
                out.append(Finding(gpu=gpu, check="dcgm", severity=t.status, evidence=text))
    return out
