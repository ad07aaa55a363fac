"""FirmwareUpdate: install a firmware bundle on one server through its BMC's Redfish UpdateService.

Inventory first: components already at their version are skipped, and when nothing is left the run changes
nothing (no lease, no cordon). Otherwise, when the server is a Kubernetes node in service, it is taken out of
service first exactly as a burn-in takes its node (workflows/burnin/node_guard.py: a lease from the cluster's
disruption budget, a cordon, a drain), so no reset happens while workload pods run on it. Then each component in
order: SimpleUpdate, its Task followed to the end (a BMC that restarts itself is waited out), then one activation
for all of them (an AC power cycle when any component needs one, else a system reset when any needs one), then
the inventory is read back: every component must show its version. The node returns to service once it is Ready
with a new boot ID (at once when nothing reset it); with `hand_node_to` (a fleet updating an NVLink domain whole,
workflows/firmware/domain_hold.py) it stays out instead, its cordon passed to that run. A failure (a bad image: the
BMC's message) stops the server, leaves its node cordoned and quarantined with the reason, and returns the lease.

BMC credentials travel as secret references (`BmcRef.credentials`), resolved in the activities.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import SearchAttributePair, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError

from activities.firmware.activities import FirmwareActivities
from activities.firmware.models import (
    Activation,
    FirmwareVersions,
    TaskFollow,
    TaskOutcome,
    UpdateStart,
    UpdateStarted,
)
from activities.firmware.versions import refused
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import CF_BMC_URL, DeviceInfo, DeviceLookup, FirmwareRecord
from activities.redfish import BmcRef
from workflows.burnin.node_guard import KubernetesNode, NodeService
from workflows.burnin.server_burnin import bmc_from_netbox
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress, WorkflowInput
from workflows.common.call_options import BMC_CALL, BMC_RETRY, NETBOX_CALL
from workflows.common.endpoints import NETBOX, Endpoints, RetryTimeout, bmc_endpoint, gave_up_on
from workflows.firmware.bundle import ComponentStatus, FirmwareBundle, FirmwareComponent, plan
from workflows.maintenance.drain import DrainCost
from workflows.remediation.models import NodeRemediationInput, RemediationSettings
from workflows.remediation.policy import remediation_workflow_id
from workflows.validation.defaults import validation_for
from workflows.validation.gate import validate_node
from workflows.validation.models import ValidationResult, ValidationSettings

# workflow.patched() id of the validation gate before the uncordon (read only when the input asks for validation).
VALIDATION_PATCH = "firmware-update-validation"
# The cluster's validation default for a node the update takes out, when the input gives no validation.
VALIDATION_DEFAULT_PATCH = "firmware-update-validation-default"
# Refusals the inventory alone decides (a downgrade, an unknown component, a BMC that is not the node's machine)
# before the node is touched; runs from before refused a downgrade only once the node was out of service.
CHECKS_FIRST_PATCH = "firmware-update-refuses-before-writes"
# A result as NetBox records it: firmware installed on a node that failed validation is a failed update there.
RECORDED: dict[str, Literal["updated", "up-to-date", "failed"]] = {
    "updated": "updated", "up-to-date": "up-to-date", "validation-failed": "failed",
}  # fmt: skip

Phase = Literal[
    "starting", "looking-up", "recording", "reading-inventory", "updating", "activating", "verifying",
    # a Kubernetes node's (workflows/burnin/node_guard.py)
    "checking-node", "waiting-for-budget", "cordoning", "draining", "waiting-for-pods-to-terminate", "waiting-for-node",
    "uncordoning", "quarantining", "validating", "handing-to-remediation", "handing-over",
    "completed", "failed", "validation-failed",
]  # fmt: skip


class FirmwareTarget(StrictModel):
    """One server: its name (as NetBox and Kubernetes know it), its BMC, and the node it is, if any."""

    name: str = Field(min_length=1, max_length=64, description="The server's name (its NetBox device name).")
    bmc: BmcRef | None = Field(None, description="Default: from the NetBox device's custom fields.")
    kubernetes: KubernetesNode | None = Field(
        None, description="The Kubernetes node this server is: refused while in service, unless the update takes "
        "it out of service itself (take_out_of_service).",
    )  # fmt: skip

    _name = field_validator("name")(validate_object_name)


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be positive")
    return value


class FirmwareSettings(StrictModel):
    """What to install and how: one server's update, and every server's of a fleet (workflows/firmware/fleet.py)."""

    bundle: FirmwareBundle
    allow_downgrade: bool = Field(False, description="Install a component older than the one installed.")
    record_in_netbox: bool = Field(False, description="Look the device up in NetBox (its BMC, unless given) and "
                                   "record the result: the versions read back and a journal entry.")  # fmt: skip
    task_timeout: timedelta = Field(timedelta(hours=1), description="How long one component's BMC task may run "
                                    "(including a BMC restarting itself).")  # fmt: skip
    activation_timeout: timedelta = Field(timedelta(minutes=15), description="How long after the reset or power "
                                          "cycle the new versions may take to show.")  # fmt: skip
    boot_timeout: timedelta = Field(timedelta(minutes=15), description="How long the node may take to be Ready "
                                    "again after the reset.")  # fmt: skip

    validation: ValidationSettings | None = Field(
        None, description="Checks a node taken out of service must pass before it returns to service "
        "(docs/validation.md); one that fails stays cordoned and quarantined with the reason.",
    )  # fmt: skip

    remediation: RemediationSettings | None = Field(
        None, description="Hand a node that fails validation to NodeRemediation with these settings (its ladder "
        "of fixes; its validation, unless set, this one) instead of quarantining it.",
    )  # fmt: skip

    _timeouts = field_validator("task_timeout", "activation_timeout", "boot_timeout")(_positive)

    def validation_refused(self, node: KubernetesNode | None, where: str) -> str | None:
        """Why `validation` cannot apply to a server that is `node` (the input's field `where`), or None."""
        if self.validation is None or not self.validation.enabled or (node is not None and node.take_out_of_service):
            return None
        return f"validation gates a node's return to service: {where} needs take_out_of_service (or no validation)"

    def settings(self) -> dict[str, object]:
        """These fields' values, for a server's own input."""
        return {name: getattr(self, name) for name in FirmwareSettings.model_fields}


def firmware_update_id(server: str) -> str:
    return f"firmware-update/{server}"


class FirmwareUpdateInput(WorkflowInput, RetryTimeout, FirmwareSettings):
    """Install a firmware bundle on one server."""

    server: FirmwareTarget
    hand_node_to: str | None = Field(
        None, description="Set by a fleet that returns an NVLink domain's nodes together: once updated, read back "
        "(and validated) and back from its reset, the node stays cordoned, its cordon passed to this run (a workflow "
        "ID), and the lease is returned (the cordon keeps it counted out of service).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _bmc_known(self) -> FirmwareUpdateInput:
        if self.server.bmc is None and not self.record_in_netbox:
            raise ValueError("server.bmc is required when record_in_netbox is false")
        if refused := self.validation_refused(self.server.kubernetes, "server.kubernetes"):
            raise ValueError(refused)
        return self

    def workflow_id(self) -> str:
        return firmware_update_id(self.server.name)

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.NODE, self.server.name)]


class FirmwareUpdateResult(DrainCost):
    server: str
    bundle: str
    result: Literal["updated", "up-to-date", "validation-failed"]
    components: list[ComponentStatus]
    versions: dict[str, str] = Field(default_factory=dict, description="The inventory read back at the end.")
    notes: list[str] = Field(default_factory=list)
    validation: ValidationResult | None = Field(None, description="The validation gate's verdict, when asked for.")
    remediation: str | None = Field(None, description="The NodeRemediation a node failing validation went to.")
    node_handed_to: str | None = Field(None, description="The run now holding the node's cordon (hand_node_to): "
                                       "out of service until that run returns it.")  # fmt: skip


@workflow.defn
class FirmwareUpdate:
    @workflow.init
    def __init__(self, inp: FirmwareUpdateInput) -> None:
        self._inp = inp
        self._phases = Phases(finished=("completed", "failed", "validation-failed"))
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)
        self._components: list[ComponentStatus] = []

    @workflow.query(description="Short progress for pollers such as `millwright watch`: the component being "
                    "updated and its task's state; done/total count the components to update.")  # fmt: skip
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.query(description="Each component's state, task and task state.")
    def components(self) -> list[ComponentStatus]:
        return self._components

    def _enter(self, phase: Phase, details: str = "") -> None:
        todo = [c for c in self._components if c.state != "at-target"]
        done = sum(c.state == "active" for c in todo)
        self._phases.enter(phase, details, done=done, total=len(todo))

    @workflow.run
    async def run(self, inp: FirmwareUpdateInput) -> FirmwareUpdateResult:
        try:
            result = await self._run(inp)
        except (ActivityError, ApplicationError) as err:
            if inp.record_in_netbox and not gave_up_on(err, NETBOX):
                await self._record(inp, "failed", {}, str(err.cause if isinstance(err, ActivityError) else err))
            raise
        if inp.record_in_netbox:
            details = self._phases.progress.details
            self._enter("recording", result.result)
            summary = "\n".join(f"- {c.name}: {c.state} {c.version}" for c in result.components)
            await self._record(inp, RECORDED[result.result], result.versions,
                               summary + "".join(f"\n- {n}" for n in result.notes))  # fmt: skip
            self._enter("validation-failed" if result.result == "validation-failed" else "completed", details)
        return result

    async def _record(self, inp: FirmwareUpdateInput, outcome: Literal["updated", "up-to-date", "failed"],
                      versions: dict[str, str], summary: str) -> None:  # fmt: skip
        record = FirmwareRecord(device=DeviceLookup(name=inp.server.name), result=outcome, bundle=inp.bundle.name,
                                versions=versions, summary=summary[:8000] or outcome)  # fmt: skip
        await self._calls.execute(NetBoxActivities.record_firmware, record, **NETBOX_CALL,
                                  summary=f"record firmware {outcome}")  # fmt: skip

    async def _run(self, inp: FirmwareUpdateInput) -> FirmwareUpdateResult:
        checks_first = workflow.patched(CHECKS_FIRST_PATCH)  # at the start: no local activity has just returned
        target = inp.server
        bmc, device = (target.bmc, None) if target.bmc is not None else await self._bmc_from_netbox(target.name)
        self._enter("reading-inventory", target.name)
        before = await self._inventory(bmc, "firmware inventory before")
        self._components = plan(inp.bundle, before.versions)
        result = FirmwareUpdateResult(server=target.name, bundle=inp.bundle.name, result="up-to-date",
                                      components=self._components, versions=before.versions)  # fmt: skip
        todo = [c for c in self._components if c.state == "pending"]
        if not todo:
            self._enter("completed", f"every component of {inp.bundle.name} already installed")
            return result
        if checks_first:
            self._refuse_early(inp, todo, before, device)
        node = None
        if target.kubernetes is not None:
            node = NodeService(target.kubernetes, target.name, self._enter, operation="firmware update")
            if target.kubernetes.take_out_of_service:  # before the node is touched: a bad default fails here
                default = await validation_for(target.kubernetes.cluster, inp.validation, VALIDATION_DEFAULT_PATCH)
                inp = inp.model_copy(update={"validation": default})
            # A node in service, or another machine than the BMC's, is refused here, before anything changes.
            await node.take_out(before.system if checks_first else None)
        try:
            boot_id = await node.before_disk_boot() if node is not None else None
            by_name = {c.name: c for c in inp.bundle.components}
            for status in todo:
                await self._update(bmc, by_name[status.name], status, inp)
            reset = await self._activate(bmc, inp)
            self._enter("verifying", "firmware inventory after")
            after = await self._inventory(bmc, "firmware inventory after")
            result.versions = after.versions
            for status in todo:
                missing = {t: after.versions.get(t) for t in by_name[status.name].inventory_ids
                           if after.versions.get(t) != status.version}  # fmt: skip
                if missing:
                    status.state, status.message = "failed", f"inventory shows {missing} after activation"
                    raise ApplicationError(f"{target.name}: {status.name} not at {status.version}: {status.message}",
                                           type="FirmwareNotActivated", non_retryable=True)  # fmt: skip
                status.state = "active"
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) and err.cause else err
            reason = f"firmware update failed: {cause}"
            self._enter("failed", reason)
            if node is not None:
                await node.back_in(False, reason, None, inp.boot_timeout)
            raise ApplicationError(f"{target.name}: {cause}", type=getattr(cause, "type", None) or "FirmwareUpdateFailed",
                                   non_retryable=True) from err  # fmt: skip
        result.result = "updated"
        if node is not None:
            result.add(node.status)  # what its drain cost the GPU work on it
            if self._validates(inp, node):
                if reset and boot_id is not None:
                    await node.wait_rebooted(boot_id, inp.boot_timeout)
                reset = False  # back from the reset already: the uncordon waits no more
                if not await self._validated(inp, node, bmc, result):
                    return result
            if inp.hand_node_to is not None and node.status.cordoned_by_us:
                await self._hand_node(inp, node, boot_id if reset else None, result)
            else:
                await node.back_in(True, "", boot_id if reset else None, inp.boot_timeout, rebooted=reset)
            result.notes += [node.status.note] if node.status.note else []
        self._enter("completed", ", ".join(f"{c.name} {c.version}" for c in todo))
        return result

    async def _hand_node(self, inp: FirmwareUpdateInput, node: NodeService, boot_id: str | None,
                         result: FirmwareUpdateResult) -> None:  # fmt: skip
        """Keep the node out of service for the run `hand_node_to`: once back from its reset (a new boot ID), pass
        it our cordon and return the lease. A cordon no longer ours (someone took it meanwhile) stays theirs, and
        the lease is returned as after any update."""
        assert inp.hand_node_to is not None
        if boot_id is not None:
            await node.wait_rebooted(boot_id, inp.boot_timeout)
        to = inp.hand_node_to
        self._enter("handing-over", f"{node.status.node} to {to}")
        reason = f"firmware {inp.bundle.name} installed; out of service until {to} returns its NVLink domain whole"
        if await node.hand_over(to, reason):
            result.node_handed_to = to
        else:
            await node.back_in(True, "", None, inp.boot_timeout, rebooted=False)

    async def _bmc_from_netbox(self, name: str) -> tuple[BmcRef, DeviceInfo]:
        self._enter("looking-up", f"NetBox device {name}")
        found = await self._calls.execute(NetBoxActivities.find_device, DeviceLookup(name=name), **NETBOX_CALL,
                                          summary=f"find {name}")  # fmt: skip
        if found.device is None:
            raise ApplicationError(f"no device {name!r} in NetBox", type="DeviceNotFound", non_retryable=True)
        return bmc_from_netbox(name, found.device), found.device

    def _refuse_early(self, inp: FirmwareUpdateInput, todo: list[ComponentStatus], before: FirmwareVersions,
                      device: DeviceInfo | None) -> None:  # fmt: skip
        """Refuse what the inventory read before any write decides: a component the BMC does not have, a downgrade
        not allowed, a BMC whose system is not the NetBox device (serial) or that names no one system for its node."""
        name, system = inp.server.name, before.system
        by_name = {c.name: c for c in inp.bundle.components}
        for status in todo:
            kind, why = refused(by_name[status.name].inventory_ids, status.version, before.versions,
                                inp.allow_downgrade)  # fmt: skip
            if kind:
                status.state, status.message = "failed", why
                self._enter("failed", f"{status.name}: {why}")
                raise ApplicationError(f"{name}: {status.name}: {why} (nothing was changed)", type=kind,
                                       non_retryable=True)  # fmt: skip
        if system is None and inp.server.kubernetes is not None:
            raise ApplicationError(f"{name}: its BMC has several systems; name the node's in bmc.system",
                                   type="RedfishRejected", non_retryable=True)  # fmt: skip
        if (device is not None and device.serial and system is not None and system.serial
                and device.serial.strip().lower() != system.serial.strip().lower()):  # fmt: skip
            raise ApplicationError(
                f"server {name}: NetBox records serial {device.serial}, but the BMC it names reports system serial "
                f"{system.serial} (UUID {system.uuid or '(none)'}): not the same machine. Refused before any change; "
                f"correct the device's {CF_BMC_URL} in NetBox", type="ServerIdentityMismatch", non_retryable=True,
            )  # fmt: skip

    def _validates(self, inp: FirmwareUpdateInput, node: NodeService) -> bool:
        return (inp.validation is not None and inp.validation.enabled and node.status.cordoned_by_us
                and workflow.patched(VALIDATION_PATCH))  # fmt: skip

    async def _validated(self, inp: FirmwareUpdateInput, node: NodeService, bmc: BmcRef,
                         result: FirmwareUpdateResult) -> bool:  # fmt: skip
        """The validation gate on the node, back from its reset. A node that fails (result `validation-failed`) is
        handed, still cordoned, to remediation when the input asks, else stays cordoned and quarantined."""
        assert inp.validation is not None
        self._enter("validating", node.status.node)
        verdict = await validate_node(node.ref.cluster, node.status.node, inp.validation,
                                      by=workflow.info().workflow_id)  # fmt: skip
        result.validation = verdict
        if verdict.passed:
            return True
        reason = f"validation failed after firmware {inp.bundle.name}: {verdict.reason}"
        if inp.remediation is not None and await self._remediate(inp, node, bmc, reason):
            result.remediation = remediation_workflow_id(node.ref.cluster, node.status.node)
        else:
            await node.back_in(False, reason, None, inp.boot_timeout)
        result.result, result.notes = "validation-failed", [*result.notes, node.status.note]
        self._enter("validation-failed", reason)
        return False

    async def _remediate(self, inp: FirmwareUpdateInput, node: NodeService, bmc: BmcRef, reason: str) -> bool:
        """Pass the node's cordon to its NodeRemediation and start that run (it outlives this one); False when the
        cordon was not ours to pass."""
        assert inp.remediation is not None
        cluster, name = node.ref.cluster, node.status.node
        to = remediation_workflow_id(cluster, name)
        self._enter("handing-to-remediation", to)
        if not await node.hand_over(to, reason):
            return False
        settings = inp.remediation.model_copy(update={"validation": inp.remediation.validation or inp.validation})
        child = NodeRemediationInput(cluster=cluster, node=name, reason=reason[:1024], bmc=bmc,
                                     requested_by=workflow.info().workflow_id, **dict(settings))  # fmt: skip
        try:
            await workflow.start_child_workflow(
                "NodeRemediation", child, id=to, id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON, static_summary=f"remediate {name}: {reason}",
            )  # fmt: skip
        except WorkflowAlreadyStartedError:
            node.status.note += f" ({to} was already running)"
        return True

    async def _inventory(self, bmc: BmcRef, summary: str) -> FirmwareVersions:
        return await self._calls.execute(FirmwareActivities.firmware_inventory, bmc, **BMC_CALL,
                                         endpoint=bmc_endpoint(bmc), summary=summary)  # fmt: skip

    async def _update(self, bmc: BmcRef, comp: FirmwareComponent, status: ComponentStatus,
                      inp: FirmwareUpdateInput) -> None:  # fmt: skip
        self._enter("updating", f"{comp.name} → {comp.version}: starting")
        status.state = "updating"
        started: UpdateStarted = await self._calls.execute(
            FirmwareActivities.start_firmware_update,
            UpdateStart(bmc=bmc, targets=comp.inventory_ids, image_uri=comp.image_uri, version=comp.version,
                        transfer_protocol=comp.transfer_protocol, apply_time=comp.apply_time,
                        allow_downgrade=inp.allow_downgrade, push=comp.push),
            **BMC_CALL, endpoint=bmc_endpoint(bmc), summary=f"start {comp.name} {comp.version}",
        )  # fmt: skip
        if started.outcome == "at-target" or started.task is None:
            status.state = "active"
            return
        status.task, status.task_state, status.pushed = started.task, "Running", started.pushed
        self._enter("updating", f"{comp.name} → {comp.version}: task {started.task} Running")
        try:
            outcome: TaskOutcome = await self._calls.execute(
                FirmwareActivities.follow_firmware_task,
                TaskFollow(bmc=bmc, task=started.task, targets=comp.inventory_ids, version=comp.version,
                           timeout_seconds=inp.task_timeout.total_seconds()),
                start_to_close_timeout=inp.task_timeout + timedelta(minutes=5), heartbeat_timeout=timedelta(seconds=60),
                retry_policy=BMC_RETRY, endpoint=bmc_endpoint(bmc), summary=f"follow {comp.name} task",
            )  # fmt: skip
        except ActivityError as err:
            status.state, status.task_state = "failed", "Exception"
            status.message = str(err.cause.message if isinstance(err.cause, ApplicationError) else err)
            raise
        status.task_state, status.bmc_restarted = outcome.state, outcome.bmc_restarted
        status.message = "; ".join(outcome.messages)[:500]
        if outcome.active:
            status.state = "active"
        else:
            status.state = "awaiting-ac-power-cycle" if comp.activation == "ac_power_cycle" else "awaiting-reset"
        self._enter("updating", f"{comp.name} → {comp.version}: task {outcome.state}")

    async def _activate(self, bmc: BmcRef, inp: FirmwareUpdateInput) -> bool:
        """One reset or AC power cycle for every component waiting for one; False when none waits."""
        waiting = [c for c in self._components if c.state in ("awaiting-reset", "awaiting-ac-power-cycle")]
        if not waiting:
            return False
        ac = any(c.state == "awaiting-ac-power-cycle" for c in waiting)
        by_name = {c.name: c for c in inp.bundle.components}
        want = {t: c.version for c in waiting for t in by_name[c.name].inventory_ids}
        how: Literal["reset", "ac_power_cycle"] = "ac_power_cycle" if ac else "reset"
        self._enter("activating", f"{how.replace('_', ' ')} for " + ", ".join(c.name for c in waiting))
        await self._calls.execute(
            FirmwareActivities.activate_firmware,
            Activation(bmc=bmc, how=how, want=want, timeout_seconds=inp.activation_timeout.total_seconds()),
            start_to_close_timeout=inp.activation_timeout + timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=60), retry_policy=BMC_RETRY, endpoint=bmc_endpoint(bmc),
            summary=how.replace("_", " "),
        )  # fmt: skip
        return True
