"""A patch decided around a local activity while queries come in (worker/patch_placement.py): decided right after
the activity returns, every worker logs it at ERROR (and the tests fail on that log, tests/conftest.py); decided
before it with `decide_early`, every run replays, those whose workflow task a query split after the local
activity among them. tests/histories/known_bad/node_remediation_query_during_local_activity.json is a
`NodeRemediation` of the first kind that does not replay (the CI run that found it)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory, WorkflowQueryFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.patch_placement_shape import PATCH, DecidedAfter, DecidedEarly
from worker.registry import Registration, new_worker, workflow_runner

RUNS = 8


@activity.defn(name="inspect_node")
async def inspect_node() -> None:
    return None


@activity.defn(name="read_setting")
async def read_setting() -> str:
    await asyncio.sleep(0.05)  # long enough for the queries below to come in while it runs
    return "setting"


async def queried_runs(client, queue: str, workflow) -> list[WorkflowHistory]:
    """RUNS runs of `workflow` at once, each queried every 10 ms while it runs; their histories."""

    async def one() -> WorkflowHistory:
        handle = await client.start_workflow(workflow.run, id=f"patch-placement-{uuid.uuid4().hex[:8]}",
                                             task_queue=queue)  # fmt: skip
        result = asyncio.ensure_future(handle.result())
        while not result.done():
            with contextlib.suppress(WorkflowQueryFailedError):  # a run that no longer replays fails its queries
                await handle.query(DecidedAfter.phase)
            await asyncio.sleep(0.01)
        assert await result is True
        return await handle.fetch_history()

    return await asyncio.gather(*(one() for _ in range(RUNS)))


MARKS = (EventType.EVENT_TYPE_MARKER_RECORDED, EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES)


def split_by_a_query(history: WorkflowHistory) -> bool:
    """A workflow task completed with nothing after it but markers (and the patches' upserts), and the next one
    scheduled at once: the worker handed back the local activity's result in a task of its own, for the query
    that came in."""
    since_completed: list[int] | None = None
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            since_completed = []
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED and since_completed is not None:
            if all(t in MARKS for t in since_completed):
                return True
            since_completed = None
        elif since_completed is not None:
            since_completed.append(event.event_type)
    return False


async def test_a_patch_decided_after_a_local_activity_is_logged_and_one_decided_early_replays(
    client, misplaced_patches
):  # fmt: skip
    queue = f"patch-placement-{uuid.uuid4().hex[:8]}"
    registration = Registration(workflows=[DecidedAfter, DecidedEarly], activities=[inspect_node, read_setting])
    async with new_worker(client, registration, queue):
        after = await queried_runs(client, queue, DecidedAfter)
        logged = list(misplaced_patches)
        misplaced_patches.clear()  # made on purpose
        early = await queried_runs(client, queue, DecidedEarly)

    assert logged and all("DecidedAfter workflow ID" in line for line in logged), logged
    for history in after:
        assert any(f"patch {PATCH} " in line and f"DecidedAfter workflow ID {history.workflow_id} " in line
                   for line in logged), (history.workflow_id, logged)  # fmt: skip
    assert not misplaced_patches, misplaced_patches

    assert any(split_by_a_query(h) for h in early), "no query split a workflow task: the test proves nothing"
    replayer = Replayer(workflows=[DecidedAfter, DecidedEarly], data_converter=pydantic_data_converter,
                        workflow_runner=workflow_runner())  # fmt: skip
    failures = [(await replayer.replay_workflow(h, raise_on_replay_failure=False)).replay_failure for h in early]
    assert failures == [None] * RUNS, failures
