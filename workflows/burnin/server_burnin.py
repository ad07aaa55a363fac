"""ServerBurnIn: prove one bare-metal GPU server healthy before it enters a cluster (or after a repair).

Redfish path:  NetBox lookup → `staged` → firmware inventory vs baseline → SEL noted →
one-time network boot into the burn-in image + power cycle → the host agent comes up on
its own task queue (bounded by a boot timeout) → GPU checks → stress window → checks
again → new critical SEL entries → verdict → NetBox (`active` or `failed` + quarantine
tag + journal evidence) → boot back to disk (pass) or power off (fail, configurable).

Ironic path: the same lookup and recording around Ironic manual cleaning with the
requested clean steps (e.g. IPA's `burnin_*`), its `last_error` as the evidence.

Every side effect is an idempotent activity: a power cycle is "power Off" then "power On",
each a no-op when the server already is there, so a worker killed at any point resumes
without repeating a completed power change. BMC credentials travel as secret references.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal, TypeVar

from pydantic import Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import SearchAttributePair
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from activities.gpu.activities import HostAgentActivities
from activities.gpu.models import GpuCheckRequest, GpuCheckResult, StressRequest, StressResult, host_task_queue
from activities.gpu.verdict import gpu_verdict
from activities.ironic.activities import IronicActivities
from activities.ironic.models import DriverInfoUpdate, ManageRequest, StartClean, WaitClean
from activities.ironic.steps import CleanStep
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import (
    CF_BMC_CREDENTIALS,
    CF_BMC_URL,
    CF_EXPECTED_GPUS,
    CF_FIRMWARE_BASELINE,
    CF_GPU_MODEL,
    TAG_QUARANTINE,
    BurnInRecord,
    DeviceInfo,
    DeviceLookup,
    DeviceTagsRequest,
    GpuInfo,
    GpuInventory,
    SetStatusRequest,
)
from activities.redfish import (
    BmcRef,
    BootRequest,
    BootResult,
    BootTarget,
    PowerRequest,
    PowerResult,
    RedfishActivities,
    RedfishInventory,
    SelQuery,
    SelReport,
)
from workflows.burnin.node_guard import NODE_GUARD_PATCH, KubernetesNode, NodeService
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress, WorkflowInput
from workflows.common.call_options import AGENT_HEARTBEAT, AGENT_RETRY, BMC_CALL, BMC_RETRY, NETBOX_CALL
from workflows.common.endpoints import IRONIC, NETBOX, Endpoints, RetryTimeout, bmc_endpoint, gave_up_on
from workflows.validation.defaults import validation_for
from workflows.validation.gate import validate_node
from workflows.validation.models import ValidationResult, ValidationSettings

# Runs from before BMC calls carried the SEL's path and the power state read by the call before (fewer requests).
CARRY_BMC_FACTS_PATCH = "burn-in-carries-bmc-facts"
# Runs from before the SEL was read with the inventory (one activity) and a server the boot override's read found
# Off was powered on without an Off call first (fewer activities, events and requests).
FEWER_BMC_CALLS_PATCH = "burn-in-fewer-bmc-calls"
# The validation gate before a passed node's uncordon, NetBox told after it (read only when validation is asked for).
VALIDATION_PATCH = "burn-in-validation"
VALIDATION_DEFAULT_PATCH = "burn-in-validation-default"  # the cluster's default for a node taken out, when none given
T = TypeVar("T")
TAG_BURNIN_PASSED = "millwright-burnin-passed"
TAG_BURNIN_FAILED = "millwright-burnin-failed"


Phase = Literal[
    "starting", "looking-up", "staging", "checking-firmware", "reading-sel", "booting-burn-in-image",
    # a Kubernetes node's (workflows/burnin/node_guard.py)
    "checking-node", "waiting-for-budget", "cordoning", "draining", "waiting-for-pods-to-terminate", "waiting-for-node",
    "uncordoning", "quarantining", "validating",
    "waiting-for-agent", "checking-gpus", "stressing", "re-checking-gpus", "cleaning", "deciding", "recording",
    "booting-disk", "powering-off", "completed", "failed",
]  # fmt: skip


class ExpectedHardware(StrictModel):
    gpus: int | None = Field(None, ge=0, le=64, description="How many GPUs the server must have.")
    gpu_model: str | None = Field(None, description="e.g. NVIDIA H200 (a prefix of NVML's name is enough).")
    firmware: dict[str, str] = Field(default_factory=dict, description="Firmware inventory name -> version.")


class IronicBurnIn(StrictModel):
    """Run the burn-in as Ironic manual cleaning instead of booting the image through Redfish."""

    node: str = Field(min_length=1, description="Ironic node name or UUID.")
    steps: list[CleanStep] = Field(
        default_factory=lambda: [CleanStep(interface="deploy", step=s) for s in
                                 ("burnin_cpu", "burnin_memory", "burnin_disk", "burnin_gpu")],
        min_length=1, description="Clean steps; default IPA's burn-in steps (their settings go in driver_info).",
    )  # fmt: skip
    driver_info: dict[str, str | int | bool] = Field(
        default_factory=dict, description="agent_burnin_* settings to set on the node first (durations!)."
    )
    timeout: timedelta = Field(timedelta(hours=26), description="Longest the cleaning may take.")
    poll_seconds: float | None = Field(None, gt=0, description="Between reads of the node; default the worker's.")


class ServerTarget(StrictModel):
    """One server: its NetBox name (also its host agent's name) and, optionally, what NetBox would say."""

    name: str = Field(min_length=1, max_length=64, description="NetBox device name = host agent name.")
    bmc: BmcRef | None = Field(None, description="Default: from the device's NetBox custom fields.")
    expected: ExpectedHardware | None = Field(None, description="Default: from the device's NetBox custom fields.")
    site: str | None = None
    vendor: str | None = None
    ironic: IronicBurnIn | None = Field(None, description="Burn in through Ironic cleaning instead of Redfish boot.")
    kubernetes: KubernetesNode | None = Field(
        None, description="The Kubernetes node this server is: refused while in service, unless the burn-in takes "
        "it out of service itself (workflows/burnin/node_guard.py).")  # fmt: skip

    _name = field_validator("name")(validate_object_name)


class BurnInSettings(StrictModel):
    stress_seconds: int = Field(600, ge=1, le=7 * 24 * 3600, description="Length of the GPU stress window.")
    dcgm_level: int | None = Field(3, ge=1, le=4, description="dcgmi diag -r N during stress where DCGM exists.")
    boot_target: Literal["Pxe", "UefiHttp"] = Field("Pxe", description="How the burn-in image is booted.")
    boot_timeout: timedelta = Field(timedelta(minutes=15), description="How long the agent may take to come up.")
    record_in_netbox: bool = Field(True, description="Look up and record in NetBox (statuses, journal, tags).")
    power_off_on_failure: bool = True
    boot_disk_after_pass: bool = Field(True, description="Boot the server back to its disk after a pass.")
    validation: ValidationSettings | None = Field(
        None, description="The validation gate a passed Kubernetes node the burn-in took out of service must pass "
        "on its disk before its uncordon (docs/validation.md); one that fails stays cordoned and quarantined.",
    )  # fmt: skip

    @field_validator("boot_timeout")
    @classmethod
    def _positive(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("must be positive")
        return v

    @model_validator(mode="after")
    def _validation_needs_the_disk(self) -> BurnInSettings:
        if self.validation is not None and self.validation.enabled and not self.boot_disk_after_pass:
            raise ValueError("validation gates a node's return to service from its disk: it needs "
                             "boot_disk_after_pass (or no validation)")  # fmt: skip
        return self


class ServerBurnInInput(WorkflowInput, RetryTimeout):
    """Burn in one server and record the verdict."""

    server: ServerTarget
    settings: BurnInSettings = Field(default_factory=BurnInSettings)

    @model_validator(mode="after")
    def _lookup_possible(self) -> ServerBurnInInput:
        s = self.server
        if not self.settings.record_in_netbox and s.ironic is None and (s.bmc is None or s.expected is None):
            raise ValueError("server.bmc and server.expected are required when settings.record_in_netbox is false")
        return self

    def workflow_id(self) -> str:
        return f"burn-in/{self.server.name}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.NODE, self.server.name)]


class Finding(StrictModel):
    """One reason a server is not healthy, with its evidence."""

    check: str = Field(description="firmware, sel, boot, gpu:<check>, ironic …")
    subject: str = Field("", description="What it is about: a GPU index, a firmware component, an SEL entry.")
    severity: Literal["fail", "warn"] = "fail"
    evidence: str


class ServerBurnInResult(StrictModel):
    server: str
    result: Literal["passed", "failed"]
    findings: list[Finding] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="Facts recorded that did not fail the server.")
    firmware: dict[str, str] = Field(default_factory=dict)
    gpus: int = 0
    stress_seconds: int = 0
    validation: ValidationResult | None = Field(None, description="The validation gate's verdict, when it ran.")

    def reason(self) -> str:
        """Why the server failed, in one line: its first failing finding."""
        first = next((f for f in self.findings if f.severity == "fail"), None)
        return f"burn-in failed: {first.check} {first.subject}: {first.evidence}" if first else f"burn-in {self.result}"

    def summary(self) -> str:
        fails = [f for f in self.findings if f.severity == "fail"]
        head = f"{self.server}: **{self.result}**" + (f", {len(fails)} finding(s)" if fails else "")
        lines = [head] + [f"- {f.check} {f.subject}: {f.evidence}".replace("  ", " ") for f in self.findings]
        return "\n".join(lines + [f"- note: {n}" for n in self.notes])


def firmware_findings(baseline: dict[str, str], inventory: dict[str, str]) -> list[Finding]:
    """Each baseline component that is missing or at another version."""
    out = []
    for name, want in sorted(baseline.items()):
        have = inventory.get(name)
        if have is None:
            out.append(Finding(check="firmware", subject=name, evidence=f"not in the BMC's inventory (want {want})"))
        elif have != want:
            out.append(Finding(check="firmware", subject=name, evidence=f"version {have}, baseline {want}"))
    return out


def sel_findings(report: SelReport) -> list[Finding]:
    return [Finding(check="sel", subject=f"entry {e.id}", evidence=f"{e.severity}: {e.message} ({e.message_id})")
            for e in report.critical]  # fmt: skip


def bmc_from_netbox(name: str, device: DeviceInfo) -> BmcRef:
    """The device's BMC from its custom fields; say which field is missing."""
    cf = device.custom_fields
    if not cf.get(CF_BMC_URL):
        raise ApplicationError(f"NetBox device {name} has no {CF_BMC_URL}: cannot reach its BMC",
                               type="InvalidInventory", non_retryable=True)  # fmt: skip
    return BmcRef(url=cf[CF_BMC_URL], credentials=cf.get(CF_BMC_CREDENTIALS) or None)


def target_from_netbox(name: str, device: DeviceInfo, given: ServerTarget) -> ServerTarget:
    """Fill what the caller did not give from the device's custom fields; say which field is missing."""
    cf = device.custom_fields
    bmc = given.bmc
    if bmc is None and given.ironic is None:
        bmc = bmc_from_netbox(name, device)
    expected = given.expected or ExpectedHardware(
        gpus=cf.get(CF_EXPECTED_GPUS),
        gpu_model=cf.get(CF_GPU_MODEL) or None,
        firmware=cf.get(CF_FIRMWARE_BASELINE) or {},
    )
    return given.model_copy(update={"bmc": bmc, "expected": expected, "site": given.site or device.site})


@workflow.defn
class ServerBurnIn:
    @workflow.init
    def __init__(self, inp: ServerBurnInInput) -> None:
        self._inp = inp
        self._phases = Phases(finished=("completed", "failed"))
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)
        self._findings: list[Finding] = []
        self._gpus: GpuCheckResult | None = None  # the last GPU check, recorded in NetBox
        self._carry = False  # BMC calls carry what the last one read (CARRY_BMC_FACTS_PATCH); set on the Redfish path
        self._bmc: BmcRef | None = None  # the BMC with its system's path, once the inventory found it

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.query(description="Findings so far, with their evidence.")
    def findings(self) -> list[Finding]:
        return self._findings

    def _enter(self, phase: Phase, details: str = "") -> None:
        self._phases.enter(phase, details)

    @workflow.run
    async def run(self, inp: ServerBurnInInput) -> ServerBurnInResult:  # noqa: C901 (the burn-in's steps in order, each a branch on its own outcome; split, they would hide the sequence)
        target, settings = inp.server, inp.settings
        lookup = DeviceLookup(name=target.name)
        staged = False
        node = None
        if target.kubernetes is not None and workflow.patched(NODE_GUARD_PATCH):
            node = NodeService(target.kubernetes, target.name, self._enter)
        try:
            if node is not None:  # before anything changes: a node in service (or a bad default) is refused here
                if node.ref.take_out_of_service:  # the only node the burn-in returns to service: the gate's
                    default = await validation_for(node.ref.cluster, settings.validation, VALIDATION_DEFAULT_PATCH)
                    settings = settings.model_copy(update={"validation": default})
                await node.take_out()
            if settings.record_in_netbox:
                self._enter("looking-up", f"NetBox device {target.name}")
                found = await self._calls.execute(
                    NetBoxActivities.find_device, lookup, **NETBOX_CALL, summary=f"find {target.name}"
                )
                if found.device is None:
                    raise ApplicationError(f"no device {target.name!r} in NetBox", type="DeviceNotFound",
                                           non_retryable=True)  # fmt: skip
                target = target_from_netbox(target.name, found.device, target)
                self._enter("staging")
                await self._status(lookup, "staged", "burn-in started", "info")
                staged = True
            if target.ironic is not None:
                result = await self._ironic(target, target.ironic)
            else:
                result = await self._redfish(target, settings)
        except (ActivityError, ApplicationError) as err:
            self._enter("failed", str(err))
            # Not a verdict on the server: say in NetBox why the burn-in stopped (unless NetBox is what failed).
            if staged and not gave_up_on(err, NETBOX):
                cause = err.cause if isinstance(err, ActivityError) and err.cause else err
                await self._calls.execute(
                    NetBoxActivities.record_burnin, BurnInRecord(
                        device=lookup, result="aborted", finished_at=workflow.now(),
                        summary=f"Burn-in stopped before a verdict: {cause}"[:8000]),
                    **NETBOX_CALL, summary="record burn-in aborted")  # fmt: skip
            raise
        self._findings = result.findings
        # A node that is validated is recorded after the gate, so NetBox never shows `active` a node kept out.
        validating = self._validates(settings, node, target, result)
        if settings.record_in_netbox and not validating:
            self._enter("recording", result.result)
            try:
                await self._record(lookup, result)
            except (ActivityError, ApplicationError) as err:
                # NetBox gave up: the verdict is not recorded, but the server is still left booted to its disk
                # or powered off, not in the burn-in image.
                if gave_up_on(err, NETBOX) and target.bmc is not None and target.ironic is None:
                    self._enter("failed", f"{result.result}, not recorded: {err}")
                    await self._after(target.bmc, settings, result)
                raise
        boot_id = None
        if target.ironic is None and target.bmc is not None:
            if node is not None and result.result == "passed" and settings.boot_disk_after_pass:
                boot_id = await node.before_disk_boot()
            await self._after(target.bmc, settings, result)
        if validating:
            assert node is not None and boot_id is not None
            await self._validate(node, boot_id, settings, result)
            boot_id = None  # back on its disk already: the uncordon waits no more
            if settings.record_in_netbox:
                self._enter("recording", result.result)
                await self._record(lookup, result)
        if node is not None:
            await node.back_in(result.result == "passed", result.reason(), boot_id, settings.boot_timeout,
                               rebooted=not validating)  # fmt: skip
            result.notes += [node.status.note] if node.status.note else []
        self._enter("completed", f"**{result.result}**" + (f": {result.findings[0].evidence}"
                                                           if result.findings else ""))  # fmt: skip
        return result

    def _validates(self, settings: BurnInSettings, node: NodeService | None, target: ServerTarget,
                   result: ServerBurnInResult) -> bool:  # fmt: skip
        """The gate applies to a passed node this run took out of service and boots back to its disk."""
        return (settings.validation is not None and settings.validation.enabled and result.result == "passed"
                and node is not None and node.status.cordoned_by_us and target.ironic is None
                and target.bmc is not None and settings.boot_disk_after_pass
                and workflow.patched(VALIDATION_PATCH))  # fmt: skip

    async def _validate(self, node: NodeService, boot_id: str, settings: BurnInSettings,
                        result: ServerBurnInResult) -> None:  # fmt: skip
        """The gate on the node back on its disk (Ready, a new boot ID); a node that fails it fails the burn-in."""
        assert settings.validation is not None
        await node.wait_rebooted(boot_id, settings.boot_timeout)
        self._enter("validating", node.status.node)
        verdict = await validate_node(node.ref.cluster, node.status.node, settings.validation,
                                      by=workflow.info().workflow_id)  # fmt: skip
        result.validation = verdict
        if not verdict.passed:
            result.findings.append(Finding(check="validation", subject=node.status.node, evidence=verdict.reason))
            result.result = "failed"

    # ------------------------------------------------------------ the Redfish path

    async def _redfish(self, target: ServerTarget, settings: BurnInSettings) -> ServerBurnInResult:
        assert target.bmc is not None and target.expected is not None
        bmc, expected = target.bmc, target.expected
        result = ServerBurnInResult(server=target.name, result="passed", stress_seconds=settings.stress_seconds)

        self._enter("checking-firmware")
        fewer = workflow.patched(FEWER_BMC_CALLS_PATCH)
        inventory: RedfishInventory = await self._calls.execute(
            RedfishActivities.redfish_inventory_and_sel if fewer else RedfishActivities.redfish_inventory, bmc,
            **BMC_CALL, endpoint=bmc_endpoint(bmc), summary="firmware and GPU inventory" + (" and SEL" if fewer else ""),
        )  # fmt: skip
        result.firmware = inventory.firmware
        if bmc.system is None and inventory.system:  # later calls skip looking the system up
            bmc = bmc.model_copy(update={"system": inventory.system})
        self._bmc = bmc
        result.findings += firmware_findings(expected.firmware, inventory.firmware)

        # A run with the later patch carries too, without the earlier one's marker (two history events).
        self._carry = fewer or workflow.patched(CARRY_BMC_FACTS_PATCH)
        before_sel = inventory.sel
        if before_sel is None:  # an older run, or a system without a SEL (that read says so)
            self._enter("reading-sel", "before")
            before_sel = await self._calls.execute(
                RedfishActivities.redfish_sel, SelQuery(bmc=bmc, entries=self._carried(inventory.sel_entries)),
                **BMC_CALL, endpoint=bmc_endpoint(bmc), summary="SEL before")  # fmt: skip
        if before_sel.critical:
            result.notes.append(f"{len(before_sel.critical)} critical SEL entries before burn-in "
                                f"(latest: {before_sel.critical[-1].message})")  # fmt: skip

        self._enter("booting-burn-in-image", settings.boot_target)
        await self._boot_and_cycle(bmc, settings.boot_target, fewer)

        queue = host_task_queue(target.name)
        self._enter("waiting-for-agent", queue)
        check = GpuCheckRequest(expected_count=expected.gpus, expected_model=expected.gpu_model)
        try:
            before: GpuCheckResult = await workflow.execute_activity_method(
                HostAgentActivities.host_gpu_check, check, task_queue=queue,
                # No worker polls the queue until the image has booted: that wait is the boot timeout.
                schedule_to_start_timeout=settings.boot_timeout, start_to_close_timeout=timedelta(minutes=5),
                heartbeat_timeout=AGENT_HEARTBEAT, retry_policy=AGENT_RETRY, summary="GPU checks before stress",
            )  # fmt: skip
        except ActivityError as err:
            if isinstance(err.cause, TimeoutError) and err.cause.type == TimeoutType.SCHEDULE_TO_START:
                result.findings.append(
                    Finding(
                        check="boot",
                        subject=settings.boot_target,
                        evidence=f"the host agent did not come up on {queue} within {settings.boot_timeout}",
                    )
                )
                result.result = "failed"
                return result
            if isinstance(err.cause, ApplicationError) and err.cause.type == "NvmlUnavailable":
                # The image booted but its GPU stack did not come up, even after retries.
                result.findings.append(Finding(check="gpu:nvml", evidence=err.cause.message))
                result.result = "failed"
                return result
            raise
        self._enter("stressing", f"{settings.stress_seconds}s")
        stress: StressResult = await workflow.execute_activity_method(
            HostAgentActivities.host_gpu_stress,
            StressRequest(seconds=settings.stress_seconds, dcgm_level=settings.dcgm_level), task_queue=queue,
            start_to_close_timeout=timedelta(seconds=settings.stress_seconds * 2 + 600),
            heartbeat_timeout=AGENT_HEARTBEAT, retry_policy=AGENT_RETRY, summary="GPU stress window",
        )  # fmt: skip
        self._enter("re-checking-gpus")
        after: GpuCheckResult = await workflow.execute_activity_method(
            HostAgentActivities.host_gpu_check, check, task_queue=queue,
            start_to_close_timeout=timedelta(minutes=5), heartbeat_timeout=AGENT_HEARTBEAT, retry_policy=AGENT_RETRY,
            summary="GPU checks after stress",
        )  # fmt: skip

        self._enter("reading-sel", "after")
        after_sel: SelReport = await self._calls.execute(
            RedfishActivities.redfish_sel, SelQuery(bmc=bmc, after_id=before_sel.last_id,
                                                    entries=self._carried(before_sel.entries_path)),
            **BMC_CALL, endpoint=bmc_endpoint(bmc), summary="SEL after")  # fmt: skip

        self._enter("deciding")
        verdict = gpu_verdict(check, before, after, stress)
        result.findings += [Finding(check=f"gpu:{f.check}", subject="" if f.gpu is None else f"GPU{f.gpu}",
                                    severity="fail" if f.severity == "fail" else "warn", evidence=f.evidence)
                            for f in verdict.findings]  # fmt: skip
        result.findings += sel_findings(after_sel)
        result.gpus = len(after.snapshot.gpus) if after.snapshot else 0
        result.result = "failed" if any(f.severity == "fail" for f in result.findings) else "passed"
        self._gpus = after
        return result

    def _carried(self, fact: T | None) -> T | None:
        """A fact an earlier BMC call read, for the next call to skip reading it again (not in older runs)."""
        return fact if self._carry else None

    async def _boot_and_cycle(self, bmc: BmcRef, target: BootTarget, fewer: bool = False) -> None:
        """A one-time boot from `target`: the override, then power Off and On, each told what the last one read.
        With `fewer`, a server the override's read found Off is not asked again: power On alone boots it."""
        boot: BootResult = await self._calls.execute(
            RedfishActivities.redfish_set_boot, BootRequest(bmc=bmc, target=target, enabled="Once"), **BMC_CALL,
            endpoint=bmc_endpoint(bmc), summary=f"one-time boot {target}")  # fmt: skip
        state = boot.power_state
        if not (fewer and state == "Off"):
            state = (await self._power(bmc, "Off", self._carried(state))).state
        await self._power(bmc, "On", self._carried(state))

    async def _power(self, bmc: BmcRef, state: Literal["On", "Off"], current: Literal["On", "Off"] | None = None
                     ) -> PowerResult:  # fmt: skip
        return await self._calls.execute(
            RedfishActivities.redfish_power, PowerRequest(bmc=bmc, state=state, current=current),
            endpoint=bmc_endpoint(bmc), start_to_close_timeout=timedelta(minutes=6),
            heartbeat_timeout=timedelta(seconds=30), retry_policy=BMC_RETRY, summary=f"power {state}",
        )  # fmt: skip

    async def _after(self, bmc: BmcRef, settings: BurnInSettings, result: ServerBurnInResult) -> None:
        """Leave the server the way operators expect: on its disk after a pass, off after a failure."""
        bmc = self._carried(self._bmc) or bmc  # the system found by the inventory
        if result.result == "passed" and settings.boot_disk_after_pass:
            self._enter("booting-disk")
            await self._boot_and_cycle(bmc, "Hdd")
        elif result.result == "failed" and settings.power_off_on_failure:
            self._enter("powering-off")
            await self._power(bmc, "Off")

    # ------------------------------------------------------------ the Ironic path

    async def _ironic(self, target: ServerTarget, ironic: IronicBurnIn) -> ServerBurnInResult:
        result = ServerBurnInResult(server=target.name, result="passed")
        self._enter("cleaning", f"Ironic node {ironic.node}")
        if ironic.driver_info:
            await self._calls.execute(
                IronicActivities.ironic_set_driver_info, DriverInfoUpdate(node=ironic.node, values=ironic.driver_info),
                **{**NETBOX_CALL, "endpoint": IRONIC}, summary="agent_burnin_* settings")  # fmt: skip
        await self._calls.execute(
            IronicActivities.ironic_manage, ManageRequest(node=ironic.node, poll_seconds=ironic.poll_seconds),
            start_to_close_timeout=timedelta(minutes=15), heartbeat_timeout=timedelta(seconds=60),
            retry_policy=BMC_RETRY, endpoint=IRONIC, summary="manage")  # fmt: skip
        await self._calls.execute(
            IronicActivities.ironic_start_clean, StartClean(node=ironic.node, steps=ironic.steps),
            **{**NETBOX_CALL, "endpoint": IRONIC}, summary="start manual cleaning")  # fmt: skip
        wait = WaitClean(node=ironic.node, timeout_seconds=ironic.timeout.total_seconds(),
                         poll_seconds=ironic.poll_seconds)  # fmt: skip
        try:
            await self._calls.execute(
                IronicActivities.ironic_wait_clean, wait, start_to_close_timeout=ironic.timeout + timedelta(minutes=5),
                heartbeat_timeout=timedelta(seconds=120), retry_policy=BMC_RETRY, endpoint=IRONIC,
                summary="wait for cleaning")  # fmt: skip
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == "IronicCleanFailed":
                result.findings.append(Finding(check="ironic", subject=ironic.node, evidence=cause.message))
                result.result = "failed"
                return result
            raise
        return result

    # ------------------------------------------------------------ NetBox

    async def _status(self, lookup: DeviceLookup, status: str, reason: str, kind: str) -> None:
        await self._calls.execute(
            NetBoxActivities.set_device_status, SetStatusRequest(device=lookup, status=status, reason=reason, kind=kind),
            **NETBOX_CALL, summary=f"NetBox status {status}")  # fmt: skip

    async def _record(self, lookup: DeviceLookup, result: ServerBurnInResult) -> None:
        gpus = self._gpus
        if gpus is not None and gpus.snapshot and gpus.snapshot.gpus:
            await self._calls.execute(
                NetBoxActivities.record_gpus, GpuInventory(device=lookup, gpus=[
                    GpuInfo(index=g.index, model=g.name or "unknown", serial=g.serial or "", uuid=g.uuid or "",
                            pci_bus_id=g.pci_bus_id or "")
                    for g in gpus.snapshot.gpus]), **NETBOX_CALL, summary="record GPUs")  # fmt: skip
        await self._calls.execute(
            NetBoxActivities.record_burnin, BurnInRecord(
                device=lookup, result=result.result, finished_at=workflow.now(), summary=result.summary()[:8000]),
            **NETBOX_CALL, summary=f"record burn-in {result.result}")  # fmt: skip
        if result.result == "passed":
            tags = DeviceTagsRequest(device=lookup, add=[TAG_BURNIN_PASSED], remove=[TAG_BURNIN_FAILED, TAG_QUARANTINE])
            await self._calls.execute(NetBoxActivities.set_device_tags, tags, **NETBOX_CALL, summary="tags")
            await self._status(lookup, "active", "burn-in passed", "success")
        else:
            tags = DeviceTagsRequest(device=lookup, add=[TAG_BURNIN_FAILED, TAG_QUARANTINE], remove=[TAG_BURNIN_PASSED])
            await self._calls.execute(NetBoxActivities.set_device_tags, tags, **NETBOX_CALL, summary="quarantine")
            await self._status(lookup, "failed", result.reason(), "danger")
