"""Replay committed histories against today's workflow code.

A change that would break runs already in flight (an activity added or reordered
without `workflow.patched`) fails here. Histories are recorded from the integration
tests with MILLWRIGHT_RECORD_HISTORIES=1 (see tests/histories/README.md).
"""

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from worker.registry import workflow_runner
from workflows.catalog import WORKFLOWS

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
# Histories that cannot replay, written by code that decided on something not in its history or decided a patch
# right after a local activity: they must keep failing the same way (the fix is for runs that start after it;
# tests/histories/README.md).
KNOWN_BAD = {
    "disruption_budget_stale_clock": "No command scheduled for event HistoryEvent(id: 117, TimerStarted)",
    "disruption_budget_stale_clock_2": "No command scheduled for event HistoryEvent(id: 98, UpsertWorkflowSearch",
    # A query came in during the local activity before the lease (worker/patch_placement.py).
    "node_remediation_query_during_local_activity": "patch marker encountered for change disruption-budget-signals",
}


def test_histories_are_committed():
    assert HISTORIES, "no committed histories to replay"


async def replay(path: Path) -> Exception | None:
    record = json.loads(path.read_text())
    history = WorkflowHistory.from_json(record["workflowId"], json.dumps(record["history"]))
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter, workflow_runner=workflow_runner())
    return (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path):
    failure = await replay(path)
    assert failure is None, f"{path.name}: {failure}"


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
async def test_known_bad_history_fails_as_recorded(name: str):
    failure = await replay(Path(__file__).parent / "histories" / "known_bad" / f"{name}.json")
    assert failure is not None and "Nondeterminism" in str(failure) and KNOWN_BAD[name] in str(failure), failure
