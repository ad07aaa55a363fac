"""What NodeRemediation records of its outcome outside the run: NetBox (quarantine, or its lifting), the node's
`millwright.dev/last-remediation` mark the sweep's cooldown reads, and the webhook. A record that fails is noted in
the run's status, never its outcome."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import TAG_QUARANTINE, DeviceLookup, DeviceTagsRequest, SetStatusRequest
from activities.node_health import NodeHealthActivities, QuarantineRequest, RemediatedMark
from activities.notify import NotifyActivities, WebhookDelivery, WebhookNotification
from workflows.common.call_options import API_CALL, NETBOX_CALL
from workflows.common.endpoints import Endpoints, kubernetes_api
from workflows.common.errors import error_text
from workflows.remediation.models import NodeRemediationInput, NodeRemediationResult, NodeRemediationStatus, Outcome

# A webhook's call: each attempt bounded by 30 s, retried within the run's notify_timeout.
NOTIFY_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(seconds=30),
                   retry_policy=RetryPolicy(initial_interval=timedelta(seconds=2), backoff_coefficient=2.0,
                                            maximum_interval=timedelta(seconds=30)))  # fmt: skip
MARK_REMEDIATED_PATCH = "remediation-mark-remediated"  # the last-remediation annotation at the end of a run


class OutcomeRecords:
    """The records of one NodeRemediation run; `status` is the run's (notes go there), `show` refreshes its details."""

    def __init__(self, inp: NodeRemediationInput, calls: Endpoints, status: NodeRemediationStatus,
                 show: Callable[[], None]) -> None:  # fmt: skip
        self._inp = inp
        self._calls = calls
        self._status = status
        self._show = show

    async def lift_quarantine(self, result: NodeRemediationResult, owner: str, why: str) -> None:
        """Untaint the node (it stays cordoned by us) and, with `netbox`, NetBox back to active, untagged."""
        inp = self._inp
        await self._calls.execute(
            NodeHealthActivities.release_quarantine, QuarantineRequest(cluster=inp.cluster, node=inp.node, owner=owner,
                                                                       reason=why),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary=f"lift the quarantine of {inp.node}")  # fmt: skip
        if inp.netbox:
            device = DeviceLookup(name=inp.node)
            try:
                await self._calls.execute(
                    NetBoxActivities.set_device_status,
                    SetStatusRequest(device=device, status="active", kind="success",
                                     reason=f"Quarantine lifted by remediation `{owner}`: {why}"),
                    **NETBOX_CALL, summary="NetBox: status active")  # fmt: skip
                await self._calls.execute(
                    NetBoxActivities.set_device_tags, DeviceTagsRequest(device=device, remove=[TAG_QUARANTINE]),
                    **NETBOX_CALL, summary=f"NetBox: untag {TAG_QUARANTINE}")  # fmt: skip
                result.netbox = f"status active, tag {TAG_QUARANTINE} removed"
            except (ActivityError, ApplicationError) as err:
                self._status.note = f"NetBox not updated: {error_text(err)}"
        self._status.note = "; ".join(n for n in (self._status.note, "quarantine lifted") if n)

    async def quarantine_in_netbox(self, why: str) -> str:
        """NetBox `failed` with a journal entry, and the quarantine tag; what NetBox did not get is noted."""
        device = DeviceLookup(name=self._inp.node)
        try:
            change = await self._calls.execute(
                NetBoxActivities.set_device_status,
                SetStatusRequest(device=device, status="failed", kind="danger",
                                 reason=f"Quarantined by remediation `{workflow.info().workflow_id}`: {why}"),
                **NETBOX_CALL, summary="NetBox: status failed")  # fmt: skip
            await self._calls.execute(
                NetBoxActivities.set_device_tags, DeviceTagsRequest(device=device, add=[TAG_QUARANTINE]),
                **NETBOX_CALL, summary=f"NetBox: tag {TAG_QUARANTINE}")  # fmt: skip
        except (ActivityError, ApplicationError) as err:  # quarantined either way; say what NetBox did not get
            self._status.note = f"NetBox not updated: {error_text(err)}"
            return self._status.note
        return f"status {change.previous} → failed, journal entry #{change.journal_entry_id}, tag {TAG_QUARANTINE}"

    async def notify(self, event: str, result: NodeRemediationResult, why: str) -> None:
        """POST the event to the webhook, retried within notify_timeout; what became of it goes in the result."""
        inp = self._inp
        if inp.webhook is None:
            return
        info = workflow.info()
        payload = {
            "cluster": inp.cluster, "node": inp.node, "reason": why, "workflow_id": info.workflow_id,
            "run_id": info.run_id, "steps": [s.model_dump() for s in self._status.steps],
            "quarantined": result.quarantined, "netbox": result.netbox,
        }  # fmt: skip
        try:
            delivery: WebhookDelivery = await self._calls.execute(
                NotifyActivities.notify_webhook,
                WebhookNotification(target=inp.webhook, event=event, payload=payload,
                                    idempotency_key=f"{info.workflow_id}/{info.run_id}/{event}"),
                **NOTIFY_CALL, endpoint=f"webhook {inp.webhook.url}", retry_timeout=inp.notify_timeout,
                setting="notify_timeout", summary=f"notify {event}")  # fmt: skip
        except (ActivityError, ApplicationError) as err:
            gave_up = err.details[0] if isinstance(err, ApplicationError) and err.type == "EndpointUnavailable" \
                else None  # fmt: skip
            tries = f" after {gave_up['attempts']} attempts" if gave_up else ""
            result.notification = f"{event}: failed{tries}: {gave_up['error'] if gave_up else error_text(err)}"
            self._status.note = "; ".join(
                n for n in (self._status.note, f"webhook not notified: {error_text(err)}") if n
            )
        else:
            result.notified = True
            result.notification = f"{event}: delivered (HTTP {delivery.status}, attempt {delivery.attempt})"
        result.note = "; ".join(n for n in (result.note, None if result.notified else "webhook not notified") if n)
        self._show()

    async def mark_remediated(self, outcome: Outcome) -> None:
        """Annotate how this remediation ended, for the sweep's cooldown; a failure to is noted, never the outcome."""
        if not workflow.patched(MARK_REMEDIATED_PATCH):
            return
        inp = self._inp
        mark = RemediatedMark(cluster=inp.cluster, node=inp.node, owner=workflow.info().workflow_id, outcome=outcome,
                              at=workflow.now())  # fmt: skip
        try:
            await self._calls.execute(
                NodeHealthActivities.mark_remediated,
                mark,
                **API_CALL,
                endpoint=kubernetes_api(inp.cluster),
                summary=f"mark {inp.node} remediated",
            )
        except (ActivityError, ApplicationError) as err:
            self._status.note = "; ".join(
                n for n in (self._status.note, f"not marked remediated: {error_text(err)}") if n
            )
