"""A deadline decided by its timer's firing (workflows/common/deadlines.py), not by the clock of the workflow task
that looks: a worker that resumes a run late sees a clock past the deadline while the history holds the answer
first, and decides as that history reads, the same live and in replay."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.deadline_shape import ANSWER, AnswerDue, AnswerDueWorkflow, Answered
from worker.registry import Registration, new_worker, workflow_runner

SECONDS = 2.0


async def history_has(handle: WorkflowHandle, *events: EventType.ValueType) -> list[EventType.ValueType]:
    """Wait until the run's history holds every one of `events`; its event types then."""
    for _ in range(200):
        types = [e.event_type for e in (await handle.fetch_history()).events]
        if all(e in types for e in events):
            return types
        await asyncio.sleep(0.05)
    raise AssertionError(f"history never held {events}")


def answer_activity(answered: asyncio.Event) -> Callable:
    @activity.defn(name=ANSWER)
    async def answer() -> None:
        await answered.wait()

    return answer


async def resumed_late(client, answered: asyncio.Event, *, answer_first: bool) -> WorkflowHandle:
    """A run whose first workflow task ran, then no workflow worker until the deadline's timer fired: with
    `answer_first` the activity answered meanwhile, before the timer; else it answers once the run decided."""
    queue, activities = f"deadline-{uuid.uuid4().hex[:8]}", f"deadline-activities-{uuid.uuid4().hex[:8]}"
    workflows = Registration(workflows=[AnswerDueWorkflow], activities=[])
    async with new_worker(client, workflows, queue, max_cached_workflows=0):  # no sticky queue to wait out
        handle = await client.start_workflow(AnswerDueWorkflow.run, AnswerDue(seconds=SECONDS, activity_queue=activities),
                                             id=f"answer-due-{uuid.uuid4().hex[:8]}", task_queue=queue)  # fmt: skip
        await history_has(handle, EventType.EVENT_TYPE_TIMER_STARTED, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    async with new_worker(client, Registration(workflows=[], activities=[answer_activity(answered)]), activities):
        if answer_first:
            answered.set()
            await history_has(handle, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
        types = await history_has(handle, EventType.EVENT_TYPE_TIMER_FIRED)
        fired, completed = EventType.EVENT_TYPE_TIMER_FIRED, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        assert not answer_first or types.index(completed) < types.index(fired)
        async with new_worker(client, workflows, queue):  # the worker back, the deadline's time long past
            with contextlib.suppress(WorkflowFailureError):  # timed out: the caller's to check
                await handle.result()
            answered.set()
    return handle


async def replays(handle: WorkflowHandle) -> None:
    replayer = Replayer(workflows=[AnswerDueWorkflow], data_converter=pydantic_data_converter,
                        workflow_runner=workflow_runner())  # fmt: skip
    replayed = await replayer.replay_workflow(await handle.fetch_history(), raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_an_answer_before_the_timer_is_in_time_though_the_resumed_clock_is_past(client):
    handle = await resumed_late(client, asyncio.Event(), answer_first=True)
    result: Answered = await handle.result()
    assert result.clock_past, "the resumed worker's clock was not past the deadline: the test proves nothing"
    await replays(handle)


async def test_a_timer_before_the_answer_times_out(client):
    handle = await resumed_late(client, asyncio.Event(), answer_first=False)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert "timed out (clock past the deadline: True)" in str(failed.value.cause)
    await replays(handle)
