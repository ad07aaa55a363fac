"""NodeRma: the return-to-vendor loop for a quarantined node (remediation's last rung), one run per node
(`rma/<cluster>/<node>`):

  check the node is quarantined (else refused, nothing written) → evidence (the quarantine's reason, the Redfish
  system and GPU serials, the critical SEL entries; NetBox's serial) → NetBox `failed`/`offline` with the evidence in
  its journal → the ticket (the evidence POSTed to `ticket`, or the `ticket_reference` given) → waiting, durably and
  for days, for an operator's `replaced` update naming the parts → a burn-in of the server (ServerBurnIn, a child;
  the node stays cordoned, so nothing is taken out of the budget twice) → the validation gate → the quarantine lifted,
  the cordon removed, NetBox `active`.

A burn-in or validation that fails leaves the node quarantined and cordoned, with the reason in the result and
NetBox's journal: a second `replaced` needs a new run. No `replaced` within `replacement_timeout`: `not-replaced`.
Its phase is the `MillwrightPhase` search attribute, so the UI lists RMAs by phase
(`MillwrightPhase = "awaiting-replacement"`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator
from temporalio import workflow
from temporalio.common import SearchAttributePair
from temporalio.exceptions import ActivityError, ApplicationError

from activities.kube.activities import KubeActivities
from activities.kube.models import CordonRequest
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import TAG_QUARANTINE, DeviceLookup, DeviceTagsRequest, SetStatusRequest
from activities.node_health import NodeHealth, NodeHealthActivities, NodeHealthRequest, QuarantineRequest
from activities.notify import NotifyActivities, WebhookDelivery, WebhookNotification, WebhookTarget
from activities.redfish import BmcRef, RedfishActivities, RedfishInventory, SelQuery, SelReport
from workflows.burnin.node_guard import KubernetesNode
from workflows.burnin.server_burnin import (
    BurnInSettings,
    ExpectedHardware,
    ServerBurnIn,
    ServerBurnInInput,
    ServerBurnInResult,
    ServerTarget,
)
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress, WorkflowInput
from workflows.common.call_options import API_CALL, BMC_CALL, NETBOX_CALL
from workflows.common.endpoints import Endpoints, RetryTimeout, bmc_endpoint, kubernetes_api
from workflows.common.errors import error_text
from workflows.remediation.models import device_facts
from workflows.remediation.records import NOTIFY_CALL
from workflows.validation.gate import validate_node
from workflows.validation.models import ValidationSettings

AWAITING = "awaiting-replacement"

# The models live beside the workflow: they carry the burn-in family's settings, which only a workflow module may
# import (tests/test_sandbox.py).
RmaOutcome = Literal["returned", "burn-in-failed", "validation-failed", "not-replaced", "refused"]


class NodeRmaInput(WorkflowInput, RetryTimeout):
    """Send a quarantined node back to its vendor, wait for the parts, burn it in, validate it, return it."""

    cluster: str = Field(description="Cluster reference: the kubeconfig context the worker knows it by.")
    node: str = Field(description="The quarantined node (also its NetBox device and host agent name).")
    ticket: WebhookTarget | None = Field(None, description="Where the RMA request and its evidence are POSTed "
                                         "(event `rma-requested`; a vendor portal, a ticketing bot).")  # fmt: skip
    ticket_reference: str | None = Field(None, max_length=200, description="An RMA ticket already opened by hand.")
    netbox: bool = Field(True, description="Evidence from NetBox (serial), the device's status while away, its "
                         "journal, and back to `active` after.")  # fmt: skip
    netbox_status: Literal["failed", "offline"] = Field("failed", description="The device's NetBox status while away.")
    bmc: BmcRef | None = Field(None, description="Default: from the NetBox device.")
    expected: ExpectedHardware | None = Field(None, description="What the burn-in expects; default: from NetBox.")
    burn_in: BurnInSettings = Field(default_factory=BurnInSettings, description="The burn-in after the repair.")
    validation: ValidationSettings = Field(default_factory=ValidationSettings,
                                           description="The gate after the burn-in, before the node returns.")  # fmt: skip
    replacement_timeout: timedelta = Field(timedelta(days=30), gt=timedelta(0),
                                           description="How long to wait for `replaced`; then the run ends "
                                           "`not-replaced` and the node stays quarantined.")  # fmt: skip
    notify_timeout: timedelta = Field(timedelta(minutes=10), gt=timedelta(0),
                                      description="How long the ticket webhook is retried.")  # fmt: skip

    _names = field_validator("cluster", "node")(validate_object_name)

    def workflow_id(self) -> str:
        return f"rma/{self.cluster}/{self.node}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster), SearchAttributePair(sa.NODE, self.node)]


class Replacement(StrictModel):
    """What the vendor or the site's technicians replaced (the operator's `replaced` update)."""

    parts: list[str] = Field(min_length=1, description="Each part replaced, e.g. `GPU3 serial 1654922004513`.")
    by: str = Field(min_length=1, max_length=200, description="Who says so (an operator, a ticket bot).")
    ticket: str | None = Field(None, max_length=200, description="The vendor's case or the site ticket.")
    note: str = Field("", max_length=1000)

    @field_validator("parts")
    @classmethod
    def _parts_named(cls, parts: list[str]) -> list[str]:
        if any(not p.strip() or len(p) > 200 for p in parts):
            raise ValueError("each part is named, in at most 200 characters")
        return parts


class RmaEvidence(StrictModel):
    """What goes to the vendor with the request: why the node was quarantined and what identifies its parts."""

    quarantine_reason: str = ""
    serial: str = Field("", description="The system's serial: Redfish, else NetBox.")
    manufacturer: str = ""
    model: str = ""
    gpu_serials: dict[str, str] = Field(default_factory=dict, description="Redfish GPU ID -> serial.")
    sel_critical: list[str] = Field(default_factory=list, description="Critical SEL entries: `created: message`.")
    sel_entries: int = 0
    not_read: list[str] = Field(default_factory=list, description="Evidence that could not be read, and why.")


class NodeRmaResult(StrictModel):
    cluster: str
    node: str
    outcome: RmaOutcome
    reason: str = ""
    evidence: RmaEvidence = Field(default_factory=RmaEvidence)
    ticket: str = Field("", description="The ticket: the reference given, or what became of the webhook.")
    replacement: Replacement | None = None
    burn_in: str = Field("", description="The burn-in's verdict and its first finding.")
    validation: str = ""
    netbox: str = ""


# ---------------------------------------------------------------- NodeRma


@workflow.defn
class NodeRma:
    @workflow.init
    def __init__(self, inp: NodeRmaInput) -> None:
        self._inp = inp
        self._phases = Phases(finished=("returned", "burn-in-failed", "validation-failed", "not-replaced", "refused"))
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)
        self._replacement: Replacement | None = None
        self._result = NodeRmaResult(cluster=inp.cluster, node=inp.node, outcome="refused")

    @workflow.query(description="Phase (awaiting-replacement while the node is away), and why.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.query(description="The evidence sent, the ticket, the replacement and the verdicts so far.")
    def status(self) -> NodeRmaResult:
        return self._result

    @workflow.update(description="The node's parts were replaced: burn it in, validate it and return it.")
    async def replaced(self, replacement: Replacement) -> NodeRmaResult:
        self._replacement = replacement
        return self._result

    @replaced.validator
    def _validate_replaced(self, replacement: Replacement) -> None:
        phase = self._phases.progress.phase
        if phase != AWAITING or self._replacement is not None:
            raise ValueError(f"the RMA of {self._inp.node} is not awaiting a replacement (phase {phase})")

    @workflow.run
    async def run(self, inp: NodeRmaInput) -> NodeRmaResult:
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster), sa.NODE.value_set(inp.node)])
        result = self._result
        self._phases.enter("checking", f"node {inp.node} in {inp.cluster}")
        health: NodeHealth = await self._calls.execute(
            NodeHealthActivities.read_node_health, NodeHealthRequest(cluster=inp.cluster, node=inp.node), **API_CALL,
            endpoint=kubernetes_api(inp.cluster), summary=f"read {inp.node}")  # fmt: skip
        if health.quarantined is None:
            raise ApplicationError(
                f"{inp.node} in {inp.cluster} is not quarantined: an RMA takes a node remediation gave up on "
                f"(NodeRemediation quarantines it when its ladder is exhausted or a finding needs an RMA)",
                type="NodeNotQuarantined", non_retryable=True,
            )  # fmt: skip
        result.evidence.quarantine_reason = health.quarantined
        self._phases.enter("gathering-evidence", f"serials and SEL of {inp.node}")
        await self._gather(inp, result.evidence)
        if inp.netbox:
            result.netbox = await self._netbox_status(inp.netbox_status, "danger", f"Sent for RMA by `{self._id}`: "
                                                      f"{self._evidence_text(result.evidence)}")  # fmt: skip
        self._phases.enter("opening-ticket", inp.ticket_reference or (str(inp.ticket.url) if inp.ticket else ""))
        result.ticket = await self._open_ticket(result)

        self._phases.enter(AWAITING, f"for `replaced` (up to {inp.replacement_timeout}); ticket: {result.ticket}")
        try:
            await workflow.wait_condition(lambda: self._replacement is not None, timeout=inp.replacement_timeout,
                                          timeout_summary="the replacement is awaited")  # fmt: skip
        except TimeoutError:
            return self._end("not-replaced", f"no `replaced` within {inp.replacement_timeout}; the node stays "
                             "quarantined")  # fmt: skip
        replacement = result.replacement = self._replacement
        assert replacement is not None
        if inp.netbox:
            await self._journal(f"Parts replaced ({replacement.by}, ticket {replacement.ticket or result.ticket}): "
                                f"{'; '.join(replacement.parts)}. {replacement.note}".strip())  # fmt: skip

        self._phases.enter("burn-in", f"{inp.node} after {'; '.join(replacement.parts)}")
        verdict = await self._burn_in(inp)
        result.burn_in = verdict.result + (f": {verdict.reason()}" if verdict.result == "failed" else "")
        if verdict.result != "passed":
            return await self._stays_away("burn-in-failed", f"burn-in failed: {verdict.reason()}")

        self._phases.enter("validating", inp.node)
        checked = await validate_node(inp.cluster, inp.node, inp.validation, by=self._id)
        result.validation = "passed" if checked.passed else f"failed: {checked.reason}"
        if not checked.passed:
            return await self._stays_away("validation-failed", f"validation failed: {checked.reason}")

        self._phases.enter("returning", f"{inp.node} to service")
        await self._return(inp, health)
        return self._end("returned", f"back in service after {'; '.join(replacement.parts)}")

    @property
    def _id(self) -> str:
        return workflow.info().workflow_id

    async def _gather(self, inp: NodeRmaInput, evidence: RmaEvidence) -> None:
        """What identifies the node's parts; a source that cannot be read is named, never fatal."""
        bmc: BmcRef | None = inp.bmc
        if inp.netbox:
            try:
                found = await self._calls.execute(NetBoxActivities.find_device, DeviceLookup(name=inp.node),
                                                  **NETBOX_CALL, summary="NetBox: find device")  # fmt: skip
                if found.device is not None:
                    evidence.serial = found.device.serial
                    bmc = bmc or device_facts(found.device).bmc
            except (ActivityError, ApplicationError) as err:
                evidence.not_read.append(f"NetBox: {error_text(err)}"[:300])
        if bmc is None:
            evidence.not_read.append("Redfish: no BMC given or in NetBox")
            return
        try:
            inventory: RedfishInventory = await self._calls.execute(
                RedfishActivities.redfish_inventory, bmc, **BMC_CALL, endpoint=bmc_endpoint(bmc),
                summary="Redfish inventory")  # fmt: skip
            evidence.serial = inventory.serial or evidence.serial
            evidence.manufacturer, evidence.model = inventory.manufacturer, inventory.model
            evidence.gpu_serials = {g.id: g.serial for g in inventory.gpus if g.serial}
            sel: SelReport = await self._calls.execute(
                RedfishActivities.redfish_sel, SelQuery(bmc=bmc, entries=inventory.sel_entries), **BMC_CALL,
                endpoint=bmc_endpoint(bmc), summary="Redfish SEL")  # fmt: skip
            evidence.sel_entries = len(sel.entries) + sel.truncated
            evidence.sel_critical = [f"{e.created or '?'}: {e.message}"[:300] for e in sel.critical][-20:]
        except (ActivityError, ApplicationError) as err:
            evidence.not_read.append(f"Redfish: {error_text(err)}"[:300])

    @staticmethod
    def _evidence_text(evidence: RmaEvidence) -> str:
        parts = [f"quarantined: {evidence.quarantine_reason}", f"serial {evidence.serial or 'unknown'}"]
        if evidence.gpu_serials:
            parts.append("GPUs " + ", ".join(f"{g} {s}" for g, s in evidence.gpu_serials.items()))
        if evidence.sel_critical:
            parts.append("critical SEL: " + "; ".join(evidence.sel_critical[-5:]))
        return ". ".join(parts)[:2000]

    async def _open_ticket(self, result: NodeRmaResult) -> str:
        inp = self._inp
        if inp.ticket is None:
            return inp.ticket_reference or "none (no ticket webhook or reference given)"
        info = workflow.info()
        payload = {"cluster": inp.cluster, "node": inp.node, "workflow_id": info.workflow_id, "run_id": info.run_id,
                   "ticket_reference": inp.ticket_reference, "evidence": result.evidence.model_dump()}  # fmt: skip
        try:
            delivery: WebhookDelivery = await self._calls.execute(
                NotifyActivities.notify_webhook,
                WebhookNotification(target=inp.ticket, event="rma-requested", payload=payload,
                                    idempotency_key=f"{info.workflow_id}/{info.run_id}/rma-requested"),
                **NOTIFY_CALL, endpoint=f"webhook {inp.ticket.url}", retry_timeout=inp.notify_timeout,
                setting="notify_timeout", summary="RMA ticket")  # fmt: skip
        except (ActivityError, ApplicationError) as err:  # the operator still has the run, its evidence and phase
            return f"webhook failed: {error_text(err)}"[:500]
        return f"requested (HTTP {delivery.status})" + (f", reference {inp.ticket_reference}"
                                                        if inp.ticket_reference else "")  # fmt: skip

    async def _burn_in(self, inp: NodeRmaInput) -> ServerBurnInResult:
        target = ServerTarget(name=inp.node, bmc=inp.bmc, expected=inp.expected,
                              kubernetes=KubernetesNode(cluster=inp.cluster, node=inp.node))  # fmt: skip
        burn = ServerBurnInInput(server=target, settings=inp.burn_in, retry_timeout=inp.retry_timeout)
        return await workflow.execute_child_workflow(ServerBurnIn.run, burn, id=f"{self._id}/burn-in",
                                                     static_summary=f"burn-in of {inp.node} after its RMA")  # fmt: skip

    async def _return(self, inp: NodeRmaInput, health: NodeHealth) -> None:
        """The quarantine lifted and the cordon removed: the cordon is the quarantining run's, which gave the node
        up; it is lifted only while that run still holds it (anyone else's cordon stays theirs)."""
        await self._calls.execute(
            NodeHealthActivities.release_quarantine,
            QuarantineRequest(cluster=inp.cluster, node=inp.node, owner=self._id, reason="returned from RMA"),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"lift the quarantine of {inp.node}")  # fmt: skip
        if health.cordoned_by:
            done = await self._calls.execute(
                KubeActivities.uncordon_node,
                CordonRequest(cluster=inp.cluster, node=inp.node, owner=health.cordoned_by, reason="returned from RMA"),
                **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"uncordon {inp.node}")  # fmt: skip
            if not done.uncordoned:
                self._result.reason = f"not uncordoned: {done.note}"
        if inp.netbox:
            self._result.netbox = await self._netbox_status("active", "success", f"Back from RMA (`{self._id}`)")
            await self._untag()

    async def _stays_away(self, outcome: RmaOutcome, why: str) -> NodeRmaResult:
        if self._inp.netbox:
            await self._journal(f"RMA `{self._id}`: {why}; the node stays quarantined")
        return self._end(outcome, f"{why}; the node stays quarantined")

    async def _netbox_status(self, status: str, kind: str, reason: str) -> str:
        try:
            change = await self._calls.execute(
                NetBoxActivities.set_device_status,
                SetStatusRequest(device=DeviceLookup(name=self._inp.node), status=status, kind=kind, reason=reason),
                **NETBOX_CALL, summary=f"NetBox: status {status}")  # fmt: skip
        except (ActivityError, ApplicationError) as err:
            return f"not updated: {error_text(err)}"[:300]
        return f"status {change.previous} → {status}, journal entry #{change.journal_entry_id}"

    async def _journal(self, text: str) -> None:
        """A journal entry without a status change: the status stays what the RMA set."""
        await self._netbox_status(self._inp.netbox_status, "info", text)

    async def _untag(self) -> None:
        try:
            await self._calls.execute(
                NetBoxActivities.set_device_tags,
                DeviceTagsRequest(device=DeviceLookup(name=self._inp.node), remove=[TAG_QUARANTINE]),
                **NETBOX_CALL, summary=f"NetBox: untag {TAG_QUARANTINE}")  # fmt: skip
        except (ActivityError, ApplicationError) as err:
            self._result.netbox += f"; tag not removed: {error_text(err)}"[:300]

    def _end(self, outcome: RmaOutcome, reason: str) -> NodeRmaResult:
        self._result.outcome = outcome
        self._result.reason = "; ".join(r for r in (reason, self._result.reason) if r)
        self._phases.enter(outcome, reason)
        return self._result
