"""Talking to Millwright's entity workflows (``Fabric``, ``DisruptionBudget``) from other workflows.

A workflow cannot send an update to another workflow, nor start one that may already run, so these
activities do it with the Temporal client the worker already holds (``activity.client()``):

- ``update_entity``: one update, with update-with-start (the entity is started on the caller's task
  queue if it does not run yet). The update ID is derived from the calling activity, so a retried
  attempt attaches to the update already sent instead of sending a second one.
- ``closed_workflows``: which of these workflow IDs have no running execution (the liveness check an
  entity runs on the holders of what it hands out).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import StrictModel


class EntityUpdate(StrictModel):
    """One update of an entity workflow, which is started with ``start_input`` if it does not run yet."""

    workflow_type: str
    workflow_id: str
    start_input: dict[str, Any]
    update: str
    payload: dict[str, Any] = Field(default_factory=dict)
    keywords: dict[str, str] = Field(default_factory=dict, description="Keyword search attributes set at start.")
    refused_type: str = Field("EntityRefused", description="The error type when the update's validator refuses.")
    entity: str = Field("", description="How errors name the entity; its workflow ID when empty.")


class WorkflowIds(StrictModel):
    ids: list[str]


async def update_with_start(call: EntityUpdate) -> Any:
    """Send ``call.update`` to the entity, starting it if needed; from inside an activity.

    A rejected update (the validator refused) is a non-retryable ``call.refused_type`` with the
    validator's message; anything else is left to the caller's retry policy.
    """
    from temporalio.client import WithStartWorkflowOperation, WorkflowUpdateFailedError
    from temporalio.common import (
        SearchAttributeKey,
        SearchAttributePair,
        TypedSearchAttributes,
        WorkflowIDConflictPolicy,
    )

    info = activity.info()
    attributes = TypedSearchAttributes(
        [SearchAttributePair(SearchAttributeKey.for_keyword(k), v) for k, v in sorted(call.keywords.items())]
    )  # fmt: skip
    start = WithStartWorkflowOperation(
        call.workflow_type, call.start_input, id=call.workflow_id, task_queue=info.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING, search_attributes=attributes,
    )  # fmt: skip
    # One ID per calling activity (stable across its retries): a retry attaches to the update it sent.
    update_id = f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"
    try:
        return await activity.client().execute_update_with_start_workflow(
            call.update, call.payload, start_workflow_operation=start, id=update_id, result_type=dict
        )
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        message = getattr(cause, "message", None) or str(cause or err)
        raise ApplicationError(f"{call.entity or call.workflow_id} refused {call.update}: {message}",
                               type=call.refused_type, non_retryable=True) from None  # fmt: skip


class EntityActivities:
    """Activities that reach other workflows through the worker's own Temporal client."""

    def activities(self) -> list[Callable]:
        return [self.update_entity, self.closed_workflows]

    @activity.defn
    async def update_entity(self, call: EntityUpdate) -> dict[str, Any]:
        """Send one update to an entity workflow (update-with-start); its result as a dict."""
        return await update_with_start(call)

    @activity.defn
    async def closed_workflows(self, req: WorkflowIds) -> list[str]:
        """The IDs among ``req.ids`` whose latest execution is closed, or that never ran."""
        from temporalio.client import WorkflowExecutionStatus
        from temporalio.service import RPCError, RPCStatusCode

        client = activity.client()
        slots = asyncio.Semaphore(20)

        async def closed(workflow_id: str) -> bool:
            async with slots:
                try:
                    described = await client.get_workflow_handle(workflow_id).describe()
                except RPCError as err:
                    if err.status == RPCStatusCode.NOT_FOUND:
                        return True
                    raise
            return described.status != WorkflowExecutionStatus.RUNNING

        ids = sorted(set(req.ids))
        flags = await asyncio.gather(*(closed(i) for i in ids))
        return [i for i, gone in zip(ids, flags) if gone]
