"""A workflow task failing for nondeterminism, as operators see it: a run of `ChangedShape` started by one worker
meets a worker whose code dropped a timer (tests/changed_shape.py). The worker logs it at ERROR with the workflow
ID and run ID (worker/nondeterminism.py), its Prometheus metrics count it per workflow type, and the history
shows the failed workflow task the replay check (worker/replay.py) reports; the reset docs/production.md
describes brings it back with its signals."""

from __future__ import annotations

import logging
import re
import uuid

import httpx
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from lab.loopback import free_port
from tests.changed_shape import NAME, After, Before
from tests.kube_helpers import wait_for
from worker.config import WorkerSettings
from worker.registry import Registration, new_worker
from worker.replay import failed_for_nondeterminism
from worker.telemetry import build_runtime

FAILED_TASKS = "temporal_workflow_task_execution_failed"


def nondeterminism_count(metrics: str, workflow_type: str) -> float:
    """The SDK's count of workflow tasks failed for nondeterminism of `workflow_type`, from /metrics text."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(FAILED_TASKS) and 'failure_reason="NonDeterminismError"' in line \
                and f'workflow_type="{workflow_type}"' in line:  # fmt: skip
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_a_run_meeting_changed_code_is_logged_at_error_and_counted(temporal_address, caplog):
    caplog.set_level(logging.ERROR, logger="millwright.worker.nondeterminism")
    settings = WorkerSettings(metrics_host="127.0.0.1", metrics_port=free_port())
    ours = await Client.connect(temporal_address, runtime=build_runtime(settings),
                                data_converter=pydantic_data_converter)  # fmt: skip
    queue = f"nondeterminism-{uuid.uuid4().hex[:8]}"
    # No sticky cache: the next workflow task goes to the changed worker at once, which replays the run.
    async with new_worker(ours, Registration(workflows=[Before], activities=[]), queue, max_cached_workflows=0):
        handle = await ours.start_workflow(Before.run, id=f"changed-shape-{uuid.uuid4().hex[:8]}", task_queue=queue)
        await handle.signal(Before.go)

        async def timer_fired():
            events = (await handle.fetch_history()).events
            return any(e.HasField("timer_fired_event_attributes") for e in events)

        await wait_for(timer_fired, what="the first code's timer")

    async with new_worker(ours, Registration(workflows=[After], activities=[]), queue):
        await handle.signal(Before.finish)  # a workflow task the changed code must replay the run for

        async def logged():
            return [r for r in caplog.records if handle.id in r.getMessage()]

        records = await wait_for(logged, what="the ERROR line")
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(settings.metrics_url)).text

    assert records[0].levelno == logging.ERROR
    line = records[0].getMessage()
    assert f"{NAME} workflow ID {handle.id} run ID {handle.result_run_id}" in line and "TimerStarted" in line, line
    assert nondeterminism_count(metrics, NAME) >= 1, [m for m in metrics.splitlines() if FAILED_TASKS in m]
    failed = failed_for_nondeterminism(await handle.fetch_history())
    assert failed and "Nondeterminism" in failed[0], failed

    # What docs/production.md says to do: reset to the workflow task before the event the error names. The new
    # run replays to there with the code deployed now, and `finish`, signalled after that point, is applied again.
    named = int(re.search(r"HistoryEvent\(id: (\d+)", line).group(1))
    history = await handle.fetch_history()
    point = max(e.event_id for e in history.events if e.event_id < named
                and e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)  # fmt: skip
    reset = await ours.workflow_service.reset_workflow_execution(ResetWorkflowExecutionRequest(
        namespace=ours.namespace, workflow_execution=WorkflowExecution(workflow_id=handle.id),
        reason="code changed", workflow_task_finish_event_id=point, request_id=str(uuid.uuid4())))  # fmt: skip
    async with new_worker(ours, Registration(workflows=[After], activities=[]), queue):
        assert await ours.get_workflow_handle(handle.id, run_id=reset.run_id).result() == "finished"
