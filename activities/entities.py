"""Talking to Millwright's entity workflows (``Fabric``, ``DisruptionBudget``) from other workflows.

A workflow cannot send an update to another workflow, nor start one that may already run, so these
activities do it with the Temporal client the worker already holds (``activity.client()``):

- ``update_entity``: one update, with update-with-start (the entity is started on the caller's task
  queue if it does not run yet). The update ID is derived from the calling activity, so a retried
  attempt attaches to the update already sent instead of sending a second one.
- ``signal_workflows``: signals, in order; each either signal-with-start of an entity (started on the
  task queue the caller names if it does not run) or a plain signal to a workflow that may have closed
  (reported back, not raised). Made as a local activity: a few short calls, safe to repeat (every
  receiver de-duplicates), so it costs its caller one history event instead of an activity's three
  plus a workflow task, and a worker killed during it holds the caller up only for a workflow task
  timeout. Signals are not limited the way updates are (10 in flight, 2,000 per run).
- ``closed_workflows``: which of these workflow IDs have no running execution (the liveness check an
  entity runs on the holders of what it hands out).
- ``query_running``: one query of a workflow's running execution; None when none runs (an entity that closed,
  or never ran, has nothing to say: the disruption budget's circuit breaker, for one, is closed then).
- ``previous_result``: the result of the run of a workflow ID that closed before this one started (an
  entity that closes when idle hands its settings to the next run this way).
- ``workflow_outcome``: waits for a run another run of the caller started (a child carried across the
  caller's continue-as-new, which the new run cannot await as a child) to close, and returns its result or
  how it failed. Heartbeats every 10 s while it waits, so a worker lost meanwhile is replaced within the
  caller's heartbeat timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import StrictModel
from activities.support.integration import Plain


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
    priority_key: int | None = Field(None, ge=1, description="The entity's task priority when this starts it "
                                     "(workflows/common/priorities.py); None: the server's default.")  # fmt: skip


class WorkflowIds(StrictModel):
    ids: list[str]


class WorkflowQuery(StrictModel):
    workflow_id: str = Field(min_length=1)
    query: str = Field(min_length=1)


class EntityStart(StrictModel):
    """How to start an entity workflow that does not run yet (signal-with-start)."""

    workflow_type: str
    start_input: dict[str, Any]
    task_queue: str = Field(min_length=1)
    keywords: dict[str, str] = Field(default_factory=dict, description="Keyword search attributes set at start.")
    priority_key: int | None = Field(None, ge=1, description="The entity's task priority when this starts it "
                                     "(workflows/common/priorities.py); None: the server's default.")  # fmt: skip


def _priority(key: int | None) -> Any:
    from temporalio.common import Priority

    return Priority(priority_key=key) if key else Priority.default


class WorkflowSignal(StrictModel):
    workflow_id: str = Field(min_length=1)
    signal: str = Field(min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)
    start: EntityStart | None = Field(None, description="Signal-with-start: start the entity if it does not run.")


class WorkflowSignals(StrictModel):
    signals: list[WorkflowSignal] = Field(description="Sent in this order.")


class RunRef(StrictModel):
    workflow_id: str
    run_id: str


class FailureCause(StrictModel):
    type: str = Field(description="The failure's type: an ApplicationError's type, else the exception's class.")
    message: str


class RunOutcome(StrictModel):
    """How a run (followed through its continue-as-new runs) closed."""

    status: Literal["completed", "failed", "terminated", "canceled", "timed-out", "not-found"]
    result: Any = Field(None, description="The result, when completed (as JSON).")
    causes: list[FailureCause] = Field(default_factory=list, description="Why it did not complete, outermost "
                                                                         "first.")  # fmt: skip


OUTCOME_HEARTBEAT_SECONDS = 10.0


def failed_outcome(cause: BaseException | None) -> RunOutcome:
    """A run's failure (the cause of a client's WorkflowFailureError, or of a workflow's ChildWorkflowError)."""
    from temporalio.exceptions import CancelledError, TerminatedError, TimeoutError

    causes: list[FailureCause] = []
    at = cause
    while at is not None:
        kind = getattr(at, "type", None)  # an ApplicationError's type (a TimeoutError's is an enum: its class then)
        causes.append(FailureCause(type=kind if isinstance(kind, str) and kind else type(at).__name__,
                                   message=(getattr(at, "message", None) or str(at))[:500]))  # fmt: skip
        at = at.__cause__
    status = ("terminated" if isinstance(cause, TerminatedError) else "canceled" if isinstance(cause, CancelledError)
              else "timed-out" if isinstance(cause, TimeoutError) else "failed")  # fmt: skip
    return RunOutcome(status=status, causes=causes)


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
    start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
        call.workflow_type, call.start_input, id=call.workflow_id, task_queue=info.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING, search_attributes=attributes,
        priority=_priority(call.priority_key),
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

    @activity.defn
    async def update_entity(self, call: EntityUpdate) -> dict[str, Any]:
        """Send one update to an entity workflow (update-with-start); its result as a dict."""
        return await update_with_start(call)

    @activity.defn
    async def signal_workflows(self, req: WorkflowSignals) -> list[str]:
        """Send the signals in order; the IDs of plain-signal receivers that no longer run (none raised)."""
        from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
        from temporalio.service import RPCError, RPCStatusCode

        client, gone = activity.client(), []
        for sig in req.signals:
            if sig.start is None:
                try:
                    await client.get_workflow_handle(sig.workflow_id).signal(sig.signal, sig.payload)
                except RPCError as err:
                    if err.status != RPCStatusCode.NOT_FOUND:
                        raise
                    gone.append(sig.workflow_id)
                continue
            start = sig.start
            attributes = TypedSearchAttributes([SearchAttributePair(SearchAttributeKey.for_keyword(k), v)
                                                for k, v in sorted(start.keywords.items())])  # fmt: skip
            await client.start_workflow(
                start.workflow_type, start.start_input, id=sig.workflow_id, task_queue=start.task_queue,
                search_attributes=attributes, start_signal=sig.signal, start_signal_args=[sig.payload],
                priority=_priority(start.priority_key),
            )  # fmt: skip
        return gone

    @activity.defn
    async def previous_result(self, ref: RunRef) -> dict[str, Any] | None:
        """The result of the newest other run of ``ref.workflow_id``, if that run completed; else None.

        Visibility only finds the runs (each is listed from its start); their status and result come from
        their histories, so a run that closed a moment ago is seen as closed.
        """
        from temporalio.client import WorkflowExecutionStatus

        client = activity.client()
        runs = [e async for e in client.list_workflows(f"WorkflowId = '{ref.workflow_id}'", limit=50)
                if e.run_id != ref.run_id]  # fmt: skip
        if not runs:
            return None
        newest = client.get_workflow_handle(ref.workflow_id, run_id=max(runs, key=lambda e: e.start_time).run_id,
                                            result_type=dict)  # fmt: skip
        if (await newest.describe()).status != WorkflowExecutionStatus.COMPLETED:
            return None
        return await newest.result(follow_runs=False)

    @activity.defn
    async def query_running(self, req: WorkflowQuery) -> dict[str, Any] | None:
        """The answer of the running execution of ``req.workflow_id`` to ``req.query``; None when none runs."""
        return await query_running(activity.client(), req)

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

    @activity.defn
    async def workflow_outcome(self, ref: RunRef) -> RunOutcome:
        """Wait until the run ``ref`` closes (following its continue-as-new runs); its result, or why it failed.

        A run that no longer exists (past the namespace's retention) is ``not-found``, an answer, not an error."""
        from temporalio.client import WorkflowFailureError
        from temporalio.service import RPCError, RPCStatusCode

        handle = activity.client().get_workflow_handle(ref.workflow_id, run_id=ref.run_id)
        waiting = asyncio.ensure_future(handle.result())
        try:
            while not (await asyncio.wait({waiting}, timeout=OUTCOME_HEARTBEAT_SECONDS))[0]:
                activity.heartbeat()
            return RunOutcome(status="completed", result=waiting.result())
        except WorkflowFailureError as err:
            return failed_outcome(err.cause)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return RunOutcome(status="not-found", causes=[FailureCause(type="NotFound", message=str(err)[:500])])
        finally:
            waiting.cancel()


async def query_running(client: Any, req: WorkflowQuery) -> dict[str, Any] | None:
    """The answer of the running execution of ``req.workflow_id`` to ``req.query``; None when none runs (a closed
    run is never queried: that needs a worker of its task queue to replay it, and may wait for one forever)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    handle = client.get_workflow_handle(req.workflow_id, result_type=dict)
    try:
        if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            return None
        return await handle.query(req.query, result_type=dict)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


class Entities(Plain):
    """The worker's own Temporal client: nothing to set."""

    name = "Entities"
    packages = ("activities.entities",)
    activities_class = EntityActivities
