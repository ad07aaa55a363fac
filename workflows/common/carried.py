"""Children that outlive the run that started them, awaited by the runs that continue it.

A fleet-wide run continues as new before its history grows long, but its children's work must not stop at that
boundary. Children are therefore started with `ParentClosePolicy.ABANDON`; the run carries each running child's
workflow ID and run ID in its continue-as-new input, and the next run waits for it with one activity
(`EntityActivities.workflow_outcome`, heartbeating while it waits), because only the run that started a child can
await it as a child. Children started by the current run are awaited as children (a failure as
`activities.entities.failed_outcome` reports it, so that both read alike).

Cost: a child awaited as a child costs its parent one event when it closes (and a workflow task); a carried one
costs 3 (activity scheduled, started, completed) and a workflow task, once per continue-as-new it spans.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from activities.entities import EntityActivities, FailureCause, RunOutcome, RunRef
from workflows.common.errors import error_text

# The wait ends when the child closes; a worker lost meanwhile is noticed within a minute and the wait resumed.
OUTCOME_HEARTBEAT = timedelta(seconds=60)
OUTCOME_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))


async def outcome_of(ref: RunRef, *, longest: timedelta, summary: str) -> RunOutcome:
    """How the run `ref` closed, waiting for it up to `longest` (its execution timeout) and a margin; the wait
    failing is a `failed` outcome naming why, never an exception."""
    try:
        return await workflow.execute_activity_method(
            EntityActivities.workflow_outcome, ref, start_to_close_timeout=longest + timedelta(minutes=10),
            heartbeat_timeout=OUTCOME_HEARTBEAT, retry_policy=OUTCOME_RETRY, summary=summary,
        )  # fmt: skip
    except ActivityError as err:
        return RunOutcome(status="failed", causes=[FailureCause(
            type="OutcomeUnknown", message=f"waiting for {ref.workflow_id} failed: {error_text(err)}")])  # fmt: skip
