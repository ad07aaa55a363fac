"""InventoryBootstrap: put Millwright's custom fields, tags, roles and statuses in place in NetBox.

Idempotent: every object is looked up before it is created, so running it any number of
times converges, and a second run reports everything as already existing. Sections run
in order (a custom field's choice set before the field).

History events: ~6 a section (one activity, one workflow task), ~35 for the five sections, and none per
node: it writes Millwright's schema in NetBox, never the fleet's devices, so it stays this size at 10,000
nodes. The fleet-wide NetBox reads are the workflows' own and go page by page (`list_devices_page`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.bootstrap import BOOTSTRAP_SECTIONS, BootstrapRequest, BootstrapSectionResult
from workflows.common.base import Progress, WorkflowInput
from workflows.common.endpoints import NETBOX, Endpoints, RetryTimeout

# NetBox calls are cheap and idempotent: retry 5xx and connection errors with backoff, visibly, and give up
# after the input's retry_timeout so a NetBox outage surfaces instead of hanging the bootstrap forever.
NETBOX_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0, maximum_interval=timedelta(seconds=30),
)  # fmt: skip
NETBOX_CALL: dict[str, Any] = dict(
    endpoint=NETBOX, start_to_close_timeout=timedelta(seconds=60), retry_policy=NETBOX_RETRY
)


class InventoryBootstrapInput(WorkflowInput, RetryTimeout):
    """Create Millwright's NetBox objects where missing; report what was created and what existed."""

    sections: list[str] = Field(
        default_factory=lambda: list(BOOTSTRAP_SECTIONS),
        description=f"Sections to ensure, in this order (default all: {', '.join(BOOTSTRAP_SECTIONS)}).",
    )

    def workflow_id(self) -> str:
        return "inventory-bootstrap"


class InventoryBootstrapResult(StrictModel):
    created: list[str] = Field(default_factory=list)
    updated: list[str] = Field(default_factory=list)
    existing: list[str] = Field(default_factory=list)
    sections: list[BootstrapSectionResult] = Field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated)


@workflow.defn
class InventoryBootstrap:
    @workflow.init
    def __init__(self, inp: InventoryBootstrapInput) -> None:
        self._inp = inp
        self._result = InventoryBootstrapResult()
        self._phase = "starting"
        self._calls = Endpoints(inp.retry_timeout)

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        r = self._result
        return Progress(
            phase=self._phase,
            done=len(r.sections),
            total=len(self._inp.sections),
            details=f"{len(r.created)} created, {len(r.updated)} updated, {len(r.existing)} already there",
            finished=self._phase in ("completed", "failed"),
            waiting=self._calls.waiting(),
        )

    @workflow.run
    async def run(self, inp: InventoryBootstrapInput) -> InventoryBootstrapResult:
        unknown = [s for s in inp.sections if s not in BOOTSTRAP_SECTIONS]
        if unknown:
            raise ApplicationError(
                f"unknown bootstrap sections {', '.join(unknown)}; known: {', '.join(BOOTSTRAP_SECTIONS)}",
                type="InvalidInput",
                non_retryable=True,
            )
        try:
            for section in inp.sections:
                self._phase = section
                workflow.set_current_details(f"**{section}**")
                done = await self._calls.execute(
                    NetBoxActivities.bootstrap_section, BootstrapRequest(section=section), **NETBOX_CALL,
                    summary=f"bootstrap {section}",
                )  # fmt: skip
                self._result.sections.append(done)
                self._result.created += done.created
                self._result.updated += done.updated
                self._result.existing += done.existing
        except (ActivityError, ApplicationError):
            self._phase = "failed"
            raise
        self._phase = "completed"
        workflow.set_current_details(self.progress().details)
        return self._result
