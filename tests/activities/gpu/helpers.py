"""Test-only: a workflow that calls one host-agent activity by name on a host's task queue."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy


class CallHostInput(BaseModel):
    activity: str
    task_queue: str
    arg: dict[str, Any] = {}
    timeout_seconds: float = 30
    heartbeat_seconds: float | None = None
    maximum_attempts: int = 1


class CallHostOutput(BaseModel):
    result: Any = None


@workflow.defn
class CallHost:
    """Runs one activity on a host agent's queue, as a burn-in workflow does."""

    @workflow.run
    async def run(self, inp: CallHostInput) -> CallHostOutput:
        result = await workflow.execute_activity(
            inp.activity, inp.arg, task_queue=inp.task_queue,
            start_to_close_timeout=timedelta(seconds=inp.timeout_seconds),
            heartbeat_timeout=timedelta(seconds=inp.heartbeat_seconds) if inp.heartbeat_seconds else None,
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), backoff_coefficient=1.0,
                                     maximum_attempts=inp.maximum_attempts),
        )  # fmt: skip
        return CallHostOutput(result=result)
