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


def test_histories_are_committed():
    assert HISTORIES, "no committed histories to replay"


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_replay(path: Path):
    record = json.loads(path.read_text())
    history = WorkflowHistory.from_json(record["workflowId"], json.dumps(record["history"]))
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter, workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"
