"""What the continue-as-new tests of fleet-wide workflows read back: the runs of a workflow ID, and the children a
run waited for although an earlier run had started them (workflows/common/carried.py)."""

from __future__ import annotations

import json
from typing import Any

from temporalio.api.enums.v1 import EventType


async def runs_of(client: Any, workflow_id: str) -> list[Any]:
    """Every run of `workflow_id` (continued-as-new ones each count), oldest first, as visibility lists them."""
    runs = [e async for e in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    return sorted(runs, key=lambda e: e.start_time)


async def continued_runs(client, started) -> list:
    """The history of every run of the workflow `started` (a handle from its start) began, from that first run
    along its continue-as-new chain to the run now open or closed, read from the histories themselves."""
    histories, run_id = [], started.first_execution_run_id
    while run_id:
        history = await client.get_workflow_handle(started.id, run_id=run_id).fetch_history()
        histories.append(history)
        last = history.events[-1]
        can = last.HasField("workflow_execution_continued_as_new_event_attributes")
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id if can else None
    return histories


async def carried_waits(client: Any, workflow_id: str) -> list[str]:
    """The summaries of the `workflow_outcome` waits the runs of `workflow_id` scheduled: children they awaited
    by ID because an earlier run had started them."""
    waits = []
    for run in await runs_of(client, workflow_id):
        history = await client.get_workflow_handle(workflow_id, run_id=run.run_id).fetch_history()
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == "workflow_outcome":
                    waits.append(json.loads(event.user_metadata.summary.data))
    return waits
