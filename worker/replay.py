"""Workflow histories replayed with this worker's code: whether runs a server holds would replay, and whether any
of their workflow tasks failed for nondeterminism while they ran.

Per run: the history replays with the worker's workflows (`temporalio.worker.Replayer` with the worker's sandbox
and converter, as tests/test_replay.py replays committed histories), and no workflow task in it failed for
nondeterminism (a failure the replay would not meet once the code that failed is gone). The crash and chaos tests
check every run they started (the `replay_histories` fixture, tests/conftest.py), and so does
`python -m bench.budget_chaos`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from worker.registry import workflow_runner
from workflows.catalog import WORKFLOWS

NONDETERMINISTIC = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR
FETCH_AT_ONCE = 8


@dataclass
class Replayed:
    runs: int
    seconds: float
    failures: list[str]  # one line per failure, naming its run
    failing: list[WorkflowHistory]  # the histories of those runs, each once

    def __str__(self) -> str:
        return f"{len(self.failing)} of {self.runs} runs failed:\n" + "\n".join(self.failures)

    def save(self, directory: Path) -> list[Path]:
        """Write the failing histories to `directory` as tests/histories/ holds them (the workflow ID and the
        history), to replay or commit."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / f"{h.workflow_id.replace('/', '_')}-{h.run_id}.json" for h in self.failing]
        for path, history in zip(paths, self.failing):
            record = {"workflowId": history.workflow_id, "history": json.loads(history.to_json())}
            path.write_text(json.dumps(record, indent=1))
        return paths


async def histories_since(client: Client, since: datetime) -> list[WorkflowHistory]:
    """The history of every run started on `client`'s server from `since` on: what visibility lists, and what it
    may not list yet, the continue-as-new successors and children those runs started (read from the histories)."""
    listed = [(e.id, e.run_id) async for e in client.list_workflows(f"StartTime >= '{since.isoformat()}'")]
    seen: set[tuple[str, str]] = set()
    found: list[WorkflowHistory] = []
    todo = list(listed)
    while todo:
        batch, todo = todo[:FETCH_AT_ONCE], todo[FETCH_AT_ONCE:]
        batch = [ref for ref in batch if ref not in seen]
        seen.update(batch)
        fetched = await asyncio.gather(*(client.get_workflow_handle(wid, run_id=rid).fetch_history()
                                         for wid, rid in batch))  # fmt: skip
        for history in fetched:
            found.append(history)
            todo.extend(ref for ref in _started_by(history) if ref not in seen)
    return found


def _started_by(history: WorkflowHistory) -> list[tuple[str, str]]:
    """The runs this run handed on to (continue-as-new) or started (children)."""
    refs = []
    for event in history.events:
        if event.HasField("workflow_execution_continued_as_new_event_attributes"):
            successor = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            refs.append((history.workflow_id, successor))
        elif event.HasField("child_workflow_execution_started_event_attributes"):
            child = event.child_workflow_execution_started_event_attributes.workflow_execution
            refs.append((child.workflow_id, child.run_id))
    return refs


def failed_for_nondeterminism(history: WorkflowHistory) -> list[str]:
    """The workflow tasks of `history` that a worker failed for nondeterminism while it ran."""
    return [
        f"event {e.event_id}: {e.workflow_task_failed_event_attributes.failure.message}"
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        and e.workflow_task_failed_event_attributes.cause == NONDETERMINISTIC
    ]


async def replay(histories: Sequence[WorkflowHistory], workflows: Sequence[type] = WORKFLOWS) -> Replayed:
    """Replay `histories` with `workflows` (runs of other types are left out) in one replayer, and check each for
    workflow tasks failed for nondeterminism."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    names = {_name(w) for w in workflows}
    ours = [h for h in histories if _workflow_type(h) in names]
    failed = [(h, f"workflow task failed while it ran, {line}") for h in ours for line in failed_for_nondeterminism(h)]
    if ours:
        replayer = Replayer(workflows=list(workflows), data_converter=pydantic_data_converter,
                            workflow_runner=workflow_runner())  # fmt: skip
        async with replayer.workflow_replay_iterator(_each(ours)) as results:
            failed += [(r.history, f"replay failed: {r.replay_failure}") async for r in results if r.replay_failure]
    failing = list({h.run_id: h for h, _ in failed}.values())
    return Replayed(runs=len(ours), seconds=loop.time() - started,
                    failures=[f"{_describe(h)}: {line}" for h, line in failed], failing=failing)  # fmt: skip


async def replay_since(client: Client, since: datetime, workflows: Sequence[type] = WORKFLOWS) -> Replayed:
    """Fetch and replay every run started from `since` on; its `seconds` count the fetching too."""
    started = asyncio.get_running_loop().time()
    replayed = await replay(await histories_since(client, since), workflows)
    replayed.seconds = asyncio.get_running_loop().time() - started
    return replayed


async def _each(histories: Sequence[WorkflowHistory]) -> AsyncIterator[WorkflowHistory]:
    for history in histories:
        yield history


def _workflow_type(history: WorkflowHistory) -> str:
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


def _describe(history: WorkflowHistory) -> str:
    return f"{_workflow_type(history)} {history.workflow_id} run {history.run_id} ({len(history.events)} events)"


def _name(workflow_class: Any) -> str:
    from temporalio.workflow import _Definition

    defn = _Definition.must_from_class(workflow_class)
    return defn.name or workflow_class.__name__
