"""The operator's controls of running operations, as functions: each a thin call of a workflow's validated update.

from starter.controls import rollout_id, rollout_pause

outcome = await rollout_pause(client, rollout_id("lab", "driver-550"), by="alice", reason="incident 4711")

Every control takes ``by`` (who) and ``reason`` (why). Where the update's request has a field for who
(``by``, ``approver``), ``by`` goes there; elsewhere it is recorded with the reason, as ``<reason> (by <who>)``.
Connect with ``identity=<who>`` too (the CLI does): the update's accepted event in the run's history names it.

A control raises ``RunNotFound`` (no run with that ID), ``RunClosed`` (the run has ended) or ``Refused`` (another
kind of workflow, or the update's validator refused it: its message says why); ``starter.client.InputError`` for a
request that does not fit the update's model.

Dry runs. Temporal has no validate-only call: an update either is refused by its validator or runs. So
``dry_run=True`` sends nothing: it checks the run (exists, is running, is the right kind), the request's model, and
then the validator's rules restated on what the run's query answers (``CHECKS``), and returns that query's answer.
The validator reads the workflow's own state, which a query does not always show in full; where the query cannot
tell (a rollout node in no batch yet: waiting, or not part of the rollout), the outcome's ``note`` says so, and a
real call may still be refused. A state that changes between the dry run and the call is checked again then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from starter.client import DEFAULT_TASK_QUEUE, InputError, format_validation_error
from workflows.budget.book import budget_text
from workflows.budget.breaker import BREAKER_QUERY, RESET_UPDATE, BreakerReset, BreakerView
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import budget_workflow_id
from workflows.budget.models import BudgetChange, BudgetView, DisruptionBudgetInput
from workflows.burnin.fleet_burnin import FleetDecision, FleetReport
from workflows.campaign.models import ApproveRequest as CampaignApproval
from workflows.campaign.models import CampaignStatus
from workflows.common.base import Progress
from workflows.firmware.bundle import ComponentStatus
from workflows.firmware.fleet import FleetFirmwareStatus
from workflows.maintenance.node_maintenance import AbortRequest, NodeMaintenanceStatus, SkipWaitRequest
from workflows.remediation.models import Approval, NodeRemediationStatus
from workflows.remediation.policy import remediation_workflow_id
from workflows.remediation.rack_models import RackApproval, RackRemediationStatus
from workflows.rollout.models import ApproveRequest, CompartmentRequest, NodeRequest, ReasonRequest, RolloutStatus


class ControlError(Exception):
    """A control that did not happen; the message says why, for a person."""


class RunNotFound(ControlError):
    pass


class RunClosed(ControlError):
    pass


class Refused(ControlError):
    pass


@dataclass(frozen=True)
class Outcome:
    workflow_id: str
    control: str
    dry_run: bool
    state: pydantic.BaseModel  # the update's answer; on a dry run, the query's answer it was checked on
    note: str = ""


Check = Callable[[Any, Any], "tuple[str | None, str]"]  # (query answer, request) -> (refusal or None, note)


@dataclass(frozen=True)
class Control:
    name: str  # as the CLI says it, e.g. "rollout pause"
    workflow_type: str | tuple[str, ...]  # a tuple: a control any of these takes (a campaign's)
    update: str
    request: type[pydantic.BaseModel]
    result: type[pydantic.BaseModel]
    query: str  # what a dry run reads
    query_result: type[pydantic.BaseModel]
    check: Check = field(repr=False)


# ---------------------------------------------------------------- the validators' rules, on the queries' answers

_ROLLOUT_INACTIVE = ("completed", "aborted", "planned", "planning", "surveying")


def _rollout_inactive(s: RolloutStatus) -> str | None:
    if s.aborted is not None:
        return f"the rollout is aborting: {s.aborted}"
    return f"the rollout is {s.phase}" if s.phase in _ROLLOUT_INACTIVE else None


def _check_rollout_active(s: RolloutStatus, _req: Any) -> tuple[str | None, str]:
    return _rollout_inactive(s), ""


def _check_pause(s: RolloutStatus, _req: Any) -> tuple[str | None, str]:
    inactive = _rollout_inactive(s)
    if inactive or s.paused_reason is None:
        return inactive, ""
    return f"already paused: {s.paused_reason}", ""


def _check_resume(s: RolloutStatus, _req: Any) -> tuple[str | None, str]:
    return _rollout_inactive(s) or (None if s.paused_reason is not None else "the rollout is not paused"), ""


def _check_approve(s: RolloutStatus, req: ApproveRequest) -> tuple[str | None, str]:
    waiting = sorted(name for name, c in s.compartments.items() if c.phase == "waiting-for-approval")
    if inactive := _rollout_inactive(s):
        return inactive, ""
    if not waiting:
        return "no batch is waiting for approval", ""
    if req.compartment and req.compartment not in waiting:
        return f"compartment {req.compartment!r} is not waiting for approval; waiting: {waiting}", ""
    return None, f"approves the next batch of {req.compartment or ', '.join(waiting)}"


def _batch_of(s: RolloutStatus, node: str) -> int | None:
    batches = [*s.recent_batches, *(c.current_batch for c in s.compartments.values() if c.current_batch)]
    return next((b.number for b in batches if node in b.order), None)


def _check_retry(s: RolloutStatus, req: NodeRequest) -> tuple[str | None, str]:
    if inactive := _rollout_inactive(s):
        return inactive, ""
    problem = s.problems.get(req.node)
    if problem is None:
        return f"node {req.node} is not erroring, blocked or skipped; only those nodes can be retried", ""
    return None, f"node {req.node} is {problem.status}: back in line"


def _check_skip(s: RolloutStatus, req: NodeRequest) -> tuple[str | None, str]:
    if inactive := _rollout_inactive(s):
        return inactive, ""
    problem = s.problems.get(req.node)
    if problem is not None:
        if problem.status == "skipped":
            return f"node {req.node} is skipped; only waiting, blocked or erroring nodes can be skipped", ""
        return None, f"node {req.node} is {problem.status}"
    batch = _batch_of(s, req.node)
    if batch is not None:
        return f"node {req.node} went in batch {batch} (in progress or complete); only waiting nodes can be skipped", ""
    return None, (
        f"node {req.node} is in no batch yet: waiting, if it is part of this rollout "
        "(the status query does not list waiting nodes; the update's validator checks membership)"
    )


def _check_reset_batch(s: RolloutStatus, req: CompartmentRequest) -> tuple[str | None, str]:
    if inactive := _rollout_inactive(s):
        return inactive, ""
    if req.compartment not in s.compartments:
        return f"unknown compartment {req.compartment!r}; known: {sorted(s.compartments)}", ""
    return None, f"batch state of {req.compartment} now: {s.compartments[req.compartment].batch_state.model_dump()}"


def _check_budget(s: BudgetView, req: BudgetChange) -> tuple[str | None, str]:
    if req.budget.count is not None and s.total_nodes is not None and req.budget.count > s.total_nodes:
        return f"count {req.budget.count} is more than the {s.total_nodes} nodes of {s.cluster}", ""
    limits = req.limits(s.limits)
    change = f" (limits {s.limits.text() or 'none'} -> {limits.text() or 'none'})" if limits != s.limits else ""
    return None, f"budget {budget_text(s.budget)} -> {budget_text(req.budget)}{change}"


def _check_breaker_reset(s: BreakerView, _req: Any) -> tuple[str | None, str]:
    if not s.enabled:
        return (
            f"this run of the disruption budget of {s.cluster} predates the circuit breaker (it has none to reset); "
            "it gets one at its next continue-as-new"
        ), ""
    return (
        None,
        "closes the tripped breaker" if s.tripped else "the breaker is closed: the reset only records who and why",
    )


def _check_maintenance_abort(s: NodeMaintenanceStatus, _req: Any) -> tuple[str | None, str]:
    if s.phase in ("uncordoning", "completed", "aborted", "failed"):
        return f"nothing to abort: the maintenance is {s.phase}", ""
    return None, "(an abort already under way is refused by the validator; the status query does not show it)"


def _check_skip_wait(s: NodeMaintenanceStatus, _req: Any) -> tuple[str | None, str]:
    if s.phase not in ("starting", "waiting-for-budget", "cordoning", "waiting-for-protected-pods"):
        return f"no wait to skip: the maintenance is {s.phase}", ""
    return None, f"the maintenance is {s.phase}"


def _check_awaiting(s: NodeRemediationStatus, req: Approval) -> tuple[str | None, str]:
    waiting = s.awaiting_approval
    if waiting is None:
        return f"no step is waiting for approval (phase {s.phase})", ""
    if req.step is not None and req.step != waiting.step:
        return f"step {req.step} is not waiting for approval; {waiting.step} is", ""
    return None, f"step {waiting.step} waits (deadline {waiting.deadline})"


def _check_rack_awaiting(s: RackRemediationStatus, _req: RackApproval) -> tuple[str | None, str]:
    if s.awaiting_approval is None:
        return f"no step is waiting for approval (phase {s.phase})", ""
    return None, f"step {s.awaiting_approval}"


def _check_fleet_paused(s: FleetReport, _req: Any) -> tuple[str | None, str]:
    if s.paused is None:
        return "the fleet burn-in is not paused; there is nothing to decide", ""
    return None, f"paused: {s.paused}"


# The fleet engine's controls (workflows/rollout/fleet_controls.py), by the group and workflow type that take them.
FLEETS = {"rollout": "Rollout", "mig": "GpuPartitioning"}


def _fleet(name: str, update: str, request: type[pydantic.BaseModel], check: Check) -> list[Control]:
    return [Control(f"{group} {name}", workflow, update, request, RolloutStatus, "status", RolloutStatus, check)
            for group, workflow in FLEETS.items()]  # fmt: skip


def _firmware_inactive(s: FleetFirmwareStatus) -> str | None:
    if s.aborted is not None:
        return f"the fleet firmware update is aborting: {s.aborted}"
    return f"the fleet firmware update is {s.phase}" if s.phase in ("completed", "aborted") else None


def _check_firmware_pause(s: FleetFirmwareStatus, _req: Any) -> tuple[str | None, str]:
    return _firmware_inactive(s) or (f"already paused ({s.paused})" if s.paused else None), ""


def _check_firmware_resume(s: FleetFirmwareStatus, _req: Any) -> tuple[str | None, str]:
    return _firmware_inactive(s) or (None if s.paused else "the fleet firmware update is not paused"), ""


def _check_firmware_abort(s: FleetFirmwareStatus, _req: Any) -> tuple[str | None, str]:
    pending = sum(x.state == "pending" for x in s.servers)
    return _firmware_inactive(s), f"{pending} server(s) not started would be skipped"


def _firmware(verb: str, check: Check) -> Control:
    return Control(f"firmware {verb}", "FleetFirmwareUpdate", verb, ReasonRequest, FleetFirmwareStatus, "status",
                   FleetFirmwareStatus, check)  # fmt: skip


def _campaign_inactive(s: CampaignStatus) -> str | None:
    if s.aborted is not None:
        return f"the campaign is aborting: {s.aborted}"
    return f"the campaign has ended: {s.phase}" if s.phase in ("completed", "failed", "aborted") else None


def _check_campaign_pause(s: CampaignStatus, _req: Any) -> tuple[str | None, str]:
    return _campaign_inactive(s) or (f"already paused: {s.paused}" if s.paused else None), s.waiting_for


def _check_campaign_resume(s: CampaignStatus, _req: Any) -> tuple[str | None, str]:
    return _campaign_inactive(s) or (None if s.paused else "the campaign is not paused"), s.waiting_for


def _check_campaign_abort(s: CampaignStatus, _req: Any) -> tuple[str | None, str]:
    pending = sorted(c for c, o in s.clusters.items() if o.state == "pending")
    return _campaign_inactive(s), f"{len(pending)} cluster(s) not started would be skipped"


def _check_campaign_approve(s: CampaignStatus, _req: Any) -> tuple[str | None, str]:
    waiting = None if s.awaiting_approval else "the campaign is not waiting for approval"
    return _campaign_inactive(s) or waiting, s.waiting_for


# The campaigns across clusters (workflows/campaign/), by workflow type with their ID's prefix (their input's
# `workflow_id`): the same controls, and `status` answering a CampaignStatus.
CAMPAIGNS = {
    "FleetRollout": "fleet-rollout",
    "FleetGpuPartitioning": "fleet-gpu-partitioning",
    "FirmwareCampaign": "firmware-campaign",
}


def _campaign(verb: str, request: type[pydantic.BaseModel], check: Check) -> Control:
    """A campaign's control (workflows/campaign/campaign.py `CampaignControls`): the update is named as the verb."""
    return Control(f"campaign {verb}", tuple(CAMPAIGNS), verb, request, CampaignStatus, "status", CampaignStatus,
                   check)  # fmt: skip


CONTROLS = {
    c.name: c
    for c in [
        *_fleet("pause", "pause", ReasonRequest, _check_pause),
        *_fleet("resume", "resume", ReasonRequest, _check_resume),
        *_fleet("abort", "abort", ReasonRequest, _check_rollout_active),
        *_fleet("approve", "approve_batch", ApproveRequest, _check_approve),
        *_fleet("retry-node", "retry_node", NodeRequest, _check_retry),
        *_fleet("skip-node", "skip_node", NodeRequest, _check_skip),
        *_fleet("reset-batch", "reset_batch_state", CompartmentRequest, _check_reset_batch),
        Control("budget set", "DisruptionBudget", "set_budget", BudgetChange, BudgetView, "state", BudgetView,
                _check_budget),
        Control("breaker reset", "DisruptionBudget", RESET_UPDATE, BreakerReset, BreakerView, BREAKER_QUERY,
                BreakerView, _check_breaker_reset),
        Control("maintenance abort", "NodeMaintenance", "abort", AbortRequest, NodeMaintenanceStatus, "status",
                NodeMaintenanceStatus, _check_maintenance_abort),
        Control("maintenance skip-wait", "NodeMaintenance", "skip_wait", SkipWaitRequest, NodeMaintenanceStatus,
                "status", NodeMaintenanceStatus, _check_skip_wait),
        Control("remediation approve", "NodeRemediation", "approve", Approval, NodeRemediationStatus, "status",
                NodeRemediationStatus, _check_awaiting),
        Control("remediation reject", "NodeRemediation", "reject", Approval, NodeRemediationStatus, "status",
                NodeRemediationStatus, _check_awaiting),
        Control("rack approve", "RackRemediation", "approve", RackApproval, RackRemediationStatus, "status",
                RackRemediationStatus, _check_rack_awaiting),
        Control("rack reject", "RackRemediation", "reject", RackApproval, RackRemediationStatus, "status",
                RackRemediationStatus, _check_rack_awaiting),
        Control("burn-in decide", "FleetBurnIn", "decide", FleetDecision, FleetReport, "report", FleetReport,
                _check_fleet_paused),
        _firmware("pause", _check_firmware_pause),
        _firmware("resume", _check_firmware_resume),
        _firmware("abort", _check_firmware_abort),
        _campaign("pause", ReasonRequest, _check_campaign_pause),
        _campaign("resume", ReasonRequest, _check_campaign_resume),
        _campaign("abort", ReasonRequest, _check_campaign_abort),
        _campaign("approve", CampaignApproval, _check_campaign_approve),
    ]
}  # fmt: skip


# ---------------------------------------------------------------- IDs


def rollout_id(cluster: str, name: str) -> str:
    """A rollout's workflow ID (workflows/rollout/spec/spec.py RolloutInput.workflow_id); a full ID passes unchanged."""
    return name if name.startswith("rollout/") else f"rollout/{cluster}/{name}"


def gpu_partitioning_id(cluster: str, name: str) -> str:
    """workflows/partitioning/models.py GpuPartitioningInput.workflow_id; a full ID passes unchanged."""
    return name if name.startswith("gpu-partitioning/") else f"gpu-partitioning/{cluster}/{name}"


def maintenance_id(cluster: str, node: str) -> str:
    return f"node-maintenance/{cluster}/{node}"  # workflows/maintenance/node_maintenance.py


def fleet_burnin_id(name: str) -> str:
    return name if name.startswith("fleet-burn-in/") else f"fleet-burn-in/{name}"  # workflows/burnin/fleet_burnin.py


def fleet_firmware_id(name: str) -> str:
    return name if name.startswith("fleet-firmware-update/") else f"fleet-firmware-update/{name}"  # workflows/firmware


async def campaign_id(client: Client, name: str) -> str:
    """The one campaign of any type named ``name`` (CAMPAIGNS); a full ID passes unchanged."""
    if "/" in name:
        return name
    found = []
    for prefix in CAMPAIGNS.values():
        with contextlib.suppress(RunNotFound):
            await described(client, f"{prefix}/{name}")
            found.append(f"{prefix}/{name}")
    if len(found) > 1:
        raise Refused(f"campaigns {' and '.join(found)} share the name {name!r}: give the full ID")
    if not found:
        ids = ", ".join(f"{prefix}/{name}" for prefix in CAMPAIGNS.values())
        raise RunNotFound(f"no campaign named {name!r} ({ids}) in namespace {client.namespace}")
    return found[0]


# ---------------------------------------------------------------- sending


def _request(control: Control, data: dict[str, Any]) -> pydantic.BaseModel:
    try:
        return control.request.model_validate(data)
    except pydantic.ValidationError as e:
        raise InputError(control.name, format_validation_error(e, control.request)) from e


def _reason(reason: str, by: str) -> str:
    return f"{reason} (by {by})"


async def described(client: Client, workflow_id: str) -> tuple[WorkflowHandle[Any, Any], Any]:
    """The latest run of ``workflow_id`` and its description; ``RunNotFound`` when there is none."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        return handle, await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFound(f"no run with ID {workflow_id!r} in namespace {client.namespace}") from None
        raise


async def running_handle(
    client: Client, workflow_id: str, workflow_type: str | tuple[str, ...]
) -> WorkflowHandle[Any, Any]:
    """The latest run of ``workflow_id``, which must be a running ``workflow_type`` (or one of them)."""
    handle, desc = await described(client, workflow_id)
    kinds = (workflow_type,) if isinstance(workflow_type, str) else workflow_type
    if desc.workflow_type not in kinds:
        raise Refused(f"{workflow_id} is a {desc.workflow_type}, not a {' or '.join(kinds)}")
    if desc.status != WorkflowExecutionStatus.RUNNING:
        state = desc.status.name.lower().replace("_", "-") if desc.status else "closed"
        raise RunClosed(f"{desc.workflow_type} {workflow_id} is {state}: a closed run takes no controls")
    return handle


async def apply_control(
    client: Client, name: str, workflow_id: str, request: dict[str, Any], *, dry_run: bool = False
) -> Outcome:
    """Validate ``request`` against the control's model, then send its update (or, dry, check it: see the module)."""
    control = CONTROLS[name]
    req = _request(control, request)
    handle = await running_handle(client, workflow_id, control.workflow_type)
    if dry_run:
        state = await handle.query(control.query, result_type=control.query_result)
        refusal, note = control.check(state, req)
        if refusal:
            raise Refused(refusal)
        return Outcome(workflow_id, name, True, state, note)
    try:
        result = await handle.execute_update(control.update, req, result_type=control.result)
    except WorkflowUpdateFailedError as e:
        cause = e.cause
        raise Refused(getattr(cause, "message", None) or str(cause or e)) from None
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:  # it closed between the look and the update
            raise RunClosed(f"{workflow_id} closed: {e.message}") from None
        raise
    return Outcome(workflow_id, name, False, result)


# ---------------------------------------------------------------- one function per control


async def rollout_control(
    client: Client, verb: str, workflow_id: str, *, by: str, reason: str, node: str | None = None,
    compartment: str | None = None, dry_run: bool = False, group: str = "rollout",
) -> Outcome:  # fmt: skip
    """``verb``: pause, resume, abort, approve, retry-node, skip-node (with ``node``), reset-batch (with
    ``compartment``), of the fleet run `group` names (FLEETS)."""
    if verb == "approve":
        request: dict[str, Any] = {"approver": by, "compartment": compartment}
    elif verb == "reset-batch":
        request = {"compartment": compartment, "reason": _reason(reason, by)}
    elif verb in ("retry-node", "skip-node"):
        request = {"node": node, "reason": _reason(reason, by)}
    else:
        request = {"reason": _reason(reason, by)}
    return await apply_control(client, f"{group} {verb}", workflow_id, request, dry_run=dry_run)


async def budget_set(
    client: Client, cluster: str, *, count: int | None = None, percent: int | None = None, by: str, reason: str,
    nvlink_domains: int | str | None = None, gangs: int | str | None = None, dry_run: bool = False,
    task_queue: str = DEFAULT_TASK_QUEUE,
) -> Outcome:  # fmt: skip
    """Exactly one of ``count`` (nodes) or ``percent`` (of the cluster's nodes) out of service at once: the
    cluster's budget, whoever asks for leases; ``nvlink_domains`` and ``gangs`` limit those units beside it (a
    number, or "none": no such limit; None: unchanged). With no entity running (none yet, or closed while idle)
    one is started on ``task_queue`` to hold it; the first requester moves it onto its own queue."""
    request: dict[str, Any] = {"budget": {"count": count, "percent": percent}, "by": by, "reason": reason}
    request |= {k: v for k, v in (("nvlink_domains", nvlink_domains), ("gangs", gangs)) if v is not None}
    if not dry_run:
        _request(CONTROLS["budget set"], request)  # refused before anything starts
        inp = DisruptionBudgetInput(cluster=cluster, task_queue=task_queue)
        await client.start_workflow(DisruptionBudget.run, inp, id=inp.workflow_id(), task_queue=task_queue,
                                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)  # fmt: skip
    return await apply_control(client, "budget set", budget_workflow_id(cluster), request, dry_run=dry_run)


async def breaker_reset(client: Client, cluster: str, *, by: str, reason: str, dry_run: bool = False) -> Outcome:
    request = {"by": by, "reason": reason}
    return await apply_control(client, "breaker reset", budget_workflow_id(cluster), request, dry_run=dry_run)


async def maintenance_abort(
    client: Client, cluster: str, node: str, *, by: str, reason: str, uncordon: bool = True, dry_run: bool = False
) -> Outcome:
    request = {"reason": _reason(reason, by), "uncordon": uncordon}
    return await apply_control(client, "maintenance abort", maintenance_id(cluster, node), request, dry_run=dry_run)


async def maintenance_skip_wait(
    client: Client, cluster: str, node: str, *, by: str, reason: str, dry_run: bool = False
) -> Outcome:
    """Stop waiting for protected pods (or the budget) and drain now."""
    request = {"reason": _reason(reason, by)}
    return await apply_control(client, "maintenance skip-wait", maintenance_id(cluster, node), request, dry_run=dry_run)


async def remediation_decide(
    client: Client, verb: str, cluster: str, node: str, *, by: str, reason: str, step: str | None = None,
    dry_run: bool = False,
) -> Outcome:  # fmt: skip
    """``verb``: approve or reject the step that waits for an operator."""
    request = {"by": by, "comment": reason, "step": step}
    wf = remediation_workflow_id(cluster, node)
    return await apply_control(client, f"remediation {verb}", wf, request, dry_run=dry_run)


async def rack_decide(
    client: Client, verb: str, workflow_id: str, *, by: str, reason: str, dry_run: bool = False
) -> Outcome:
    """``verb``: approve or reject the rack's power cycle, which waits for an operator (``workflow_id``: the
    RackRemediation's, starter/racks.py ``rack_run_id``)."""
    request = {"by": by, "comment": reason}
    return await apply_control(client, f"rack {verb}", workflow_id, request, dry_run=dry_run)


async def fleet_burnin_decide(
    client: Client, name: str, action: str, *, by: str, reason: str, dry_run: bool = False
) -> Outcome:
    """``action``: continue or abort a fleet burn-in paused for too many failures."""
    request = {"action": action, "reason": _reason(reason, by)}
    return await apply_control(client, "burn-in decide", fleet_burnin_id(name), request, dry_run=dry_run)


async def firmware_control(
    client: Client, verb: str, name: str, *, by: str, reason: str, dry_run: bool = False
) -> Outcome:
    """``verb``: pause, resume (also after a stop at the failure threshold) or abort a fleet firmware update."""
    request = {"reason": _reason(reason, by)}
    return await apply_control(client, f"firmware {verb}", fleet_firmware_id(name), request, dry_run=dry_run)


async def campaign_control(
    client: Client, verb: str, name: str, *, by: str, reason: str, dry_run: bool = False
) -> Outcome:
    """``verb``: pause, resume, abort or approve a campaign across clusters (CAMPAIGNS); ``by`` approves."""
    request = {"approver": by, "reason": reason} if verb == "approve" else {"reason": _reason(reason, by)}
    return await apply_control(client, f"campaign {verb}", await campaign_id(client, name), request, dry_run=dry_run)


async def firmware_status(client: Client, name: str) -> FleetFirmwareStatus:
    """A fleet firmware update's servers, each running one with its components, task states and phase now (its
    FirmwareUpdate's `components` and `progress` queries: the fleet's history carries only finished results)."""
    status: FleetFirmwareStatus = await client.get_workflow_handle(fleet_firmware_id(name)).query(
        "status", result_type=FleetFirmwareStatus
    )
    for server in status.servers:
        if server.state == "running" and server.workflow_id:
            child = client.get_workflow_handle(server.workflow_id)
            try:
                server.components = await child.query("components", result_type=list[ComponentStatus])
                progress = await child.query("progress", result_type=Progress)
                server.now = f"{progress.phase}: {progress.details}"
            except (RPCError, WorkflowQueryFailedError) as e:  # no worker answered: say so, show the rest
                server.reason = f"(components not read: {e})"
    return status


async def query_state(
    client: Client, workflow_id: str, workflow_type: str, query: str, result: type[pydantic.BaseModel]
) -> Any:
    """A running entity's query answer (budget ``state``, ``breaker``), with the same errors as the controls."""
    handle = await running_handle(client, workflow_id, workflow_type)
    return await handle.query(query, result_type=result)


async def budget_show(client: Client, cluster: str) -> BudgetView:
    return await query_state(client, budget_workflow_id(cluster), "DisruptionBudget", "state", BudgetView)


async def breaker_show(client: Client, cluster: str) -> BreakerView:
    return await query_state(client, budget_workflow_id(cluster), "DisruptionBudget", BREAKER_QUERY, BreakerView)
